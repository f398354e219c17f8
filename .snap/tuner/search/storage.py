"""Study storage: one Optuna RDBStorage per URL, SQLite tuned for many writers, errors in one line.

- ``sqlite:///path.db`` (the default, artifacts/studies.db): one host. WAL mode with
  ``synchronous=NORMAL`` (Optuna commits each attribute on its own; with SQLite's default fsync per
  commit a trial cost ~0.4 s of bookkeeping) and ``BEGIN IMMEDIATE`` transactions, so two workers
  cannot pop the same queued trial (SQLite ignores ``SELECT ... FOR UPDATE``).
- ``postgresql://user:pass@host:5432/db``: many hosts share the studies (row locks on the queue).

Heartbeats are on for searching storages: a trial whose worker vanished becomes FAIL once its
heartbeat is `grace_s` old, and Optuna then calls `claims.retry_stale_trial` (retried once).
Any failure to open the storage (unwritable path, a file that is not a database, a server that
does not answer, a missing driver) is one `TunerError` naming the URL without its password.
"""

from __future__ import annotations

import inspect
import math
import warnings
from pathlib import Path

from ..errors import TunerError
from . import claims

__all__ = ["make_storage", "plain", "quiet_optuna", "safe_url", "storage_url"]

SQLITE = "sqlite:///"


def quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")


def storage_url(storage: str | None, default: str) -> str:
    """A storage URL: a URL as given, a plain path as a SQLite file, None as `default`."""
    if not storage:
        return default
    if "://" in storage:
        return storage
    return f"{SQLITE}{Path(storage)}"


def safe_url(url: str) -> str:
    """The URL with its password masked, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not even a URL: say it as given
        return url


def make_storage(url: str, heartbeat_s: int | None = 10, grace_s: int | None = 60):
    """An RDBStorage for `url`; with `heartbeat_s`, heartbeats and the stale-trial retry."""
    try:
        import optuna
    except ImportError:
        raise TunerError("optuna is not installed: pip install optuna") from None
    quiet_optuna()
    kwargs: dict = {}
    if heartbeat_s:
        kwargs = {"heartbeat_interval": int(heartbeat_s), "grace_period": int(grace_s or 60)}
        accepted = inspect.signature(optuna.storages.RDBStorage.__init__).parameters
        callback = ("heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in accepted
                    else "failed_trial_callback")
        kwargs[callback] = claims.retry_stale_trial
    try:
        sqlite_file = _prepare_sqlite(url)
        engine_kwargs: dict = {}
        if url.startswith(SQLITE):
            engine_kwargs = {"connect_args": {"timeout": 60}}
        elif url.startswith(("postgresql", "postgres")):
            engine_kwargs = {"connect_args": {"connect_timeout": 10}}
        storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **kwargs)
    except TunerError:
        raise
    except Exception as exc:  # noqa: BLE001 - bad URL, unwritable path, garbage file, server down
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TunerError(f"cannot open the study storage {safe_url(url)}: {text}") from None
    if sqlite_file is not None:
        # In WAL mode, synchronous=NORMAL keeps the file consistent after a crash or kill -9
        # (only a power loss can drop the last commits). BEGIN IMMEDIATE takes the write lock
        # before a transaction reads, so two workers cannot both pop the same enqueued trial.
        import sqlalchemy

        sqlalchemy.event.listen(storage.engine, "connect", _sqlite_pragmas)
        sqlalchemy.event.listen(storage.engine, "begin", _sqlite_begin)
        storage.engine.dispose()
    return storage


def _prepare_sqlite(url: str) -> Path | None:
    """Create the SQLite file's folder and switch the file to WAL mode; None for other URLs."""
    if not url.startswith(SQLITE):
        return None
    path = Path(url[len(SQLITE):])
    if str(path) in ("", ":memory:"):
        return None
    if path.is_dir():
        raise TunerError(f"cannot open the study storage {url}: {path} is a directory, "
                         f"not a database file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TunerError(f"cannot open the study storage {url}: cannot create the folder "
                         f"{path.parent} ({exc.strerror or exc})") from None
    import sqlite3

    try:
        connection = sqlite3.connect(str(path), timeout=60)
        try:
            connection.execute("PRAGMA journal_mode=WAL")
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise TunerError(f"cannot open the study storage {url}: {exc}") from None
    return path


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" event issues BEGIN itself
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_begin(connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def plain(value):
    """Plain JSON for optuna-dashboard: numpy scalars become Python numbers, NaN/inf None."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
