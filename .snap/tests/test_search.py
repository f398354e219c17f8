"""tuner search: the real orchestration (studies, workers, supervision, heartbeats) on real
storages (SQLite files and the PostgreSQL server of `postgres_url`).

The GPU timing is replaced by `make_fake`, a cheap deterministic objective, through the same
`objective_factory` interface the GPU objective uses; everything else is the code that runs on
the GPU host. Environment variables steer the fake inside the spawned workers:
FAKE_SLEEP (seconds per evaluation), FAKE_CRASH (a config key: the worker kills itself with
SIGKILL, once per FAKE_MARK_DIR), FAKE_HANG (a config key: the evaluation never returns),
FAKE_LOG (a file: every evaluated config is appended, to prove what ran on the "GPU"),
FAKE_DONE_LOG (a file: a line "study<TAB>config<TAB>pid" per finished measurement, across
processes and hosts), FAKE_HOLD (a file: once FAKE_DONE_LOG has FAKE_HOLD_AFTER lines, the first
evaluation to start writes "study<TAB>config" there and never returns; one evaluation holds).
"""

from __future__ import annotations

import os


import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from tuner import units

from tuner import search, shapetable
from tuner.cli import main
from tuner.errors import TunerError
from tuner.search import TrialResult
from tuner.spaces import SearchSpace

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "shapes" / "examples" / "qwen25_05b_b4_decode.parquet"

# A small space with a constraint: 27 combinations, 24 allowed.
SPACE = SearchSpace("fake", "cuda",
                    {"BLOCK_N": [16, 32, 64], "BLOCK_K": [32, 64, 128], "num_warps": [1, 2, 4]},
                    ("BLOCK_N * BLOCK_K <= 4096",))
DEFAULT = {"BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 2}


# ------------------------------------------------------------------------------ the fake objective
def fake_facts(accurate: bool, cls: str):
    """Recorded parity facts: as accurate as the serving path (ratio 1.0), or three times worse."""
    from tuner.parity import ParityFacts

    ratio = 1.0 if accurate else 3.0
    return ParityFacts(False, accurate, cls, "h0", 1.6e-3 * ratio, 1.6e-3, ratio, 0, 3)


def fake_time(plan, config: dict) -> TrialResult:
    """Deterministic 'timing' of any space: a bowl over the choice indices (minimum away from the
    default), one fast config whose output 'mismatches', one config that 'fails to compile'."""
    names = [p for p in plan.space.params if len(plan.space.params[p]) > 1]
    idx = [plan.space.params[p].index(config[p]) for p in names]
    mids = [(len(plan.space.params[p]) - 1) * 0.6 for p in names]
    us = 10.0 + sum((i - m) ** 2 * (1.0 + 0.25 * j) for j, (i, m) in enumerate(zip(idx, mids)))
    us += plan.shape["n"] / 1000.0
    if idx[0] == 0 and idx[-1] == len(plan.space.params[names[-1]]) - 1:
        return TrialResult(median_us=5.0, noise_pct=1.0, facts=fake_facts(False, "bad"))
    if idx[1] == len(plan.space.params[names[1]]) - 1 and idx[-1] == 0:
        return TrialResult(failure="candidate: OutOfResources: shared memory 300000 > 232448")
    return TrialResult(median_us=round(us, 4), noise_pct=1.0, facts=fake_facts(True, "h0"))


class FakeObjective:
    def __init__(self, plan):
        self.plan = plan

    def baseline_us(self) -> float:
        return 40.0 + self.plan.shape["n"] / 1000.0

    def evaluate(self, config: dict) -> TrialResult:
        key = search.config_key(config)
        if os.environ.get("FAKE_LOG"):
            with open(os.environ["FAKE_LOG"], "a") as f:
                f.write(key + "\n")
        if not self.plan.space.allows({p: config[p] for p in self.plan.space.params}, self.plan.shape):
            return TrialResult(failure="fake: a config outside the constraints was evaluated")
        if os.environ.get("FAKE_HANG") == key:
            time.sleep(3600)
        if os.environ.get("FAKE_SLOW") == key:  # slow once: long enough to be killed mid-trial
            mark = Path(os.environ["FAKE_MARK_DIR"]) / "slow"
            if not mark.exists():
                mark.write_text("1")
                time.sleep(60)
        if os.environ.get("FAKE_HOLD") and _hold_now(self.plan.study_name, key):
            time.sleep(3600)  # mid-measurement until the test kills this supervisor
        if os.environ.get("FAKE_CRASH") == key:
            mark = Path(os.environ["FAKE_MARK_DIR"]) / "crashed"
            if not mark.exists():
                mark.write_text("1")
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
        result = fake_time(self.plan, config)
        if os.environ.get("FAKE_DONE_LOG"):  # one line per finished measurement, any process
            line = f"{self.plan.study_name}\t{key}\t{os.getpid()}\n".encode()
            fd = os.open(os.environ["FAKE_DONE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        return result


def _hold_now(study: str, key: str) -> bool:
    """FAKE_HOLD: is this evaluation the one to hold? The first to start after FAKE_DONE_LOG
    reached FAKE_HOLD_AFTER lines; O_EXCL makes it exactly one across processes."""
    after = int(os.environ.get("FAKE_HOLD_AFTER", "0"))
    if after:
        done = Path(os.environ["FAKE_DONE_LOG"])  # FAKE_HOLD_AFTER counts its lines
        if not done.exists() or len(done.read_text().splitlines()) < after:
            return False
    try:
        fd = os.open(os.environ["FAKE_HOLD"], os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    try:
        os.write(fd, f"{study}\t{key}\n".encode())
    finally:
        os.close(fd)
    return True


def make_fake(plan):
    return FakeObjective(plan)


class FailingObjective(FakeObjective):
    """Every candidate fails to compile (a broken toolchain, a space no kernel accepts)."""

    def evaluate(self, config: dict) -> TrialResult:
        return TrialResult(failure="candidate: CompilationError: ptxas fatal: unsupported arch")


def make_failing(plan):
    return FailingObjective(plan)


def make_broken(plan):
    """A worker that cannot make its objective at all (no driver, a broken install)."""
    raise RuntimeError("CUDA driver initialization failed")


# ------------------------------------------------------------------------------------ helpers
def plans_for(device_key: str, shapes=((1024, 1.0),), space=SPACE, default=DEFAULT):
    return [search.make_plan(family="fake", shape={"m": 1, "n": n, "k": 4096, "dtype": "bfloat16"},
                             shape_key=f"m=1,n={n},k=4096", device_key=device_key, backend="cuda",
                             space=space, default_config=default, weight=w,
                             attrs={"calls_per_step": 24.0, "step_us": 9000.0, "hit_rate": 1.0,
                                    "phase": "decode", "source": "test"})
            for n, w in shapes]


def settings(storage: str, **kw) -> search.SearchSettings:
    base = dict(storage=storage, sampler="grid", gpus=["0"], objective=make_fake, progress=False,
                heartbeat_s=1, grace_s=2, seed=0)
    base.update(kw)
    return search.SearchSettings(**base)


def expected_best(plan) -> tuple[dict, float]:
    """Brute force over the allowed configs: the fastest feasible one that runs."""
    best = None
    for params in plan.space.configs(plan.shape):
        config = {**plan.default_config, **params}
        r = fake_time(plan, config)
        if r.failure or not r.facts.passes("accuracy"):
            continue
        if best is None or r.median_us < best[1]:
            best = (config, r.median_us)
    return best


def trials_of(storage_url: str, name: str):
    import optuna

    storage = search.make_storage(storage_url, None, None)
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=True)


def state_counts(trials) -> dict:
    out: dict = {}
    for t in trials:
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


@pytest.fixture
def pg(postgres_url):
    """The PostgreSQL URL and a unique device key; deletes this test's studies afterwards."""
    import optuna

    key = f"test-{uuid.uuid4().hex[:10]}"
    yield postgres_url, key
    storage = search.make_storage(postgres_url, None, None)
    for s in storage.get_all_studies():
        if s.study_name.startswith(key + ":"):
            optuna.delete_study(study_name=s.study_name, storage=storage)


# ---------------------------------------------------------------------------------- the tests
def test_grid_sqlite_records_every_outcome_and_finds_the_feasible_best(tmp_path, monkeypatch):
    log = tmp_path / "evaluated.txt"
    monkeypatch.setenv("FAKE_LOG", str(log))
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    plans = plans_for("grid-test", shapes=((1024, 2.0), (2048, 1.0)))
    summary = search.run_search(plans, settings(url, gpus=["0", "1"]))

    for plan, result in zip(plans, summary.shapes):
        trials = trials_of(url, plan.study_name)
        # trial 0 is the enqueued default config
        assert trials[0].user_attrs["role"] == "default"
        assert trials[0].user_attrs["config"] == DEFAULT
        # every allowed config measured exactly once; nothing outside the constraints ran
        measured = [t for t in trials if "duplicate_of" not in t.user_attrs]
        keys = sorted(search.config_key(t.user_attrs["config"]) for t in measured)
        assert keys == sorted(plan.valid_keys)
        # the mismatching config is COMPLETE but infeasible, with its hash class
        mismatched = [t for t in measured if t.user_attrs.get("parity") == "mismatch"]
        assert mismatched and all(t.state.name == "COMPLETE" for t in mismatched)
        assert all(t.constraints["parity"] == 1.0 for t in mismatched)
        # the three facts are on every measured trial, whatever the gate
        assert all(t.user_attrs["parity_class"] == "bad" and t.user_attrs["error_ratio"] == 3.0
                   for t in mismatched)
        assert all(t.user_attrs["parity"] == "accuracy" for t in measured
                   if t.state.name == "COMPLETE" and t not in mismatched)
        # the config that does not compile is FAIL with its reason
        failed = [t for t in measured if t.state.name == "FAIL"]
        assert failed and all(t.user_attrs["failure"].startswith("candidate: OutOfResources")
                              for t in failed)
        # the best is the fastest feasible config, not the faster mismatching one
        config, us = expected_best(plan)
        assert result.best_config == config and result.best_us == pytest.approx(us)
        assert min(t.value for t in mismatched) < us
        assert result.status == "exhausted"
        # study attributes as docs/interfaces.md pins them, plain JSON
        import optuna

        study = optuna.load_study(study_name=plan.study_name,
                                  storage=search.make_storage(url, None, None))
        attrs = study.user_attrs
        assert attrs["family"] == "fake" and attrs["shape"] == plan.shape
        assert attrs["shape_key"] == plan.shape_key and attrs["device"] == "grid-test"
        assert attrs["backend"] == "cuda" and attrs["default_config"] == DEFAULT
        assert attrs["baseline_us"] == pytest.approx(40.0 + plan.shape["n"] / 1000.0)
        assert attrs["default_us"] == pytest.approx(fake_time(plan, DEFAULT).median_us)
        assert attrs["calls_per_step"] == 24.0 and attrs["phase"] == "decode"
        json.dumps(attrs)
        assert result.speedup_vs_baseline == pytest.approx(attrs["baseline_us"] / us)
        assert result.speedup_vs_default == pytest.approx(attrs["default_us"] / us)
    evaluated = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(evaluated) == sum(p.n_valid for p in plans)  # each valid config once, nothing else
    assert all(SPACE.allows({p: c[p] for p in SPACE.params}, {}) for c in evaluated)
    # the summary names every shape, its best config and speedups
    text = search.format_summary(summary)
    assert "m=1,n=1024,k=4096" in text and "exhausted" in text


def test_tpe_postgres_two_workers_resume_is_idempotent(pg):
    url, key = pg
    plans = plans_for(key)
    first = search.run_search(plans, settings(url, sampler="tpe", trials=10, gpus=["0", "1"]))
    trials = trials_of(url, plans[0].study_name)
    assert first.shapes[0].measured == 10
    # TPE's invalid proposals are PRUNED with the "space" constraint and never evaluated
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    for t in pruned:
        assert t.user_attrs["failure"].startswith("constraint")
        assert t.constraints["space"] == 1.0
    complete = {t.number: t.value for t in trials if t.state.name == "COMPLETE"}

    again = search.run_search(plans, settings(url, sampler="tpe", trials=10, gpus=["0", "1"]))
    assert [t.number for t in trials_of(url, plans[0].study_name)] == [t.number for t in trials]
    assert again.shapes[0].best_us == first.shapes[0].best_us

    more = search.run_search(plans, settings(url, sampler="tpe", trials=14, gpus=["0", "1"]))
    after = trials_of(url, plans[0].study_name)
    assert more.shapes[0].measured == 14
    assert {t.number: t.value for t in after if t.number in complete} == complete
    assert more.shapes[0].best_us <= first.shapes[0].best_us


class _CountingObjective(FakeObjective):
    def __init__(self, plan):
        super().__init__(plan)
        self.evaluated = []

    def evaluate(self, config: dict) -> TrialResult:
        self.evaluated.append(config)
        return super().evaluate(config)


def test_grid_worker_with_a_stale_view_never_measures_what_another_worker_has(tmp_path):
    """The race of two grid workers: worker B read the study while the queue was full; worker A
    then popped every queued config, finished half of them and is measuring the rest. B's trials
    (the queue is empty, so the sampler proposes) must all be answered as duplicates: no config
    measured twice, no proposal outside the constraints, no GPU time."""
    import optuna

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    plan = plans_for("race-test")[0]
    search.prepare_studies([plan], settings(url))
    storage = search.make_storage(url, None, None)
    worker_a = optuna.load_study(study_name=plan.study_name, storage=storage)
    stale = search.read_state(worker_a.get_trials(deepcopy=False), plan)
    assert stale.waiting == plan.n_valid
    for i in range(plan.n_valid):  # worker A takes the whole queue
        trial = worker_a.ask()
        params = {name: trial.suggest_categorical(name, list(choices))
                  for name, choices in plan.space.params.items()}
        trial.set_user_attr("config", {**DEFAULT, **params})
        if i % 2 == 0:
            worker_a.tell(trial, 1.0 + i)
    worker_b = optuna.load_study(study_name=plan.study_name, storage=storage,
                                 sampler=search.make_sampler("grid", 0, plan.n_valid,
                                                             search.valid_params(plan)))
    objective = _CountingObjective(plan)
    for _ in range(30):
        search.run_trial(worker_b, plan, stale, objective)
    assert objective.evaluated == []
    trials = worker_b.get_trials(deepcopy=False)
    mine = trials[plan.n_valid:]
    assert len(mine) == 30 and all("duplicate_of" in t.user_attrs for t in mine)
    for t in mine:
        prior = trials[t.user_attrs["duplicate_of"]]
        assert prior.user_attrs["config"] == t.user_attrs["config"]
        if prior.state.name == "RUNNING":  # being measured: stepped aside, not counted
            assert t.state.name == "FAIL" and t.user_attrs["failure"].startswith(search.SKIPPED)
        else:
            assert t.state.name == "COMPLETE" and t.value == prior.value
    assert search.read_state(trials, plan).measured == (plan.n_valid + 1) // 2


def test_time_budget_is_shared_in_proportion_to_headroom(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SLEEP", "0.1")
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    plans = plans_for("share-test", shapes=((1024, 3.0), (2048, 1.0)))
    summary = search.run_search(plans, settings(url, sampler="random", timeout_s=8.0, slice_s=0.0))
    spent = {s.shape_key: s.spent_s for s in summary.shapes}
    ratio = spent["m=1,n=1024,k=4096"] / spent["m=1,n=2048,k=4096"]
    assert 2.0 < ratio < 4.5, spent
    assert all(s.status == "time" for s in summary.shapes)
    assert summary.wall_s < 8.0 + 10
    assert search.share_time(plans, 8.0) == {plans[0].study_name: 6.0, plans[1].study_name: 2.0}


def test_worker_killed_mid_trial_is_restarted_and_the_trial_retried(tmp_path, monkeypatch):
    """A candidate that kills its worker (SIGKILL, as a corrupted GPU context can): the parent
    marks the trial FAIL with the reason, enqueues it once more, starts a fresh worker."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    plans = plans_for("crash-test")
    best_config, best_us = expected_best(plans[0])
    monkeypatch.setenv("FAKE_CRASH", search.config_key(best_config))
    monkeypatch.setenv("FAKE_MARK_DIR", str(tmp_path))
    summary = search.run_search(plans, settings(url))
    trials = trials_of(url, plans[0].study_name)
    died = [t for t in trials if str(t.user_attrs.get("failure", "")).startswith("worker died")]
    assert len(died) == 1 and "SIGKILL" in died[0].user_attrs["failure"]
    assert died[0].state.name == "FAIL"
    retried = [t for t in trials if t.user_attrs.get("retry_of") == died[0].number]
    assert len(retried) == 1 and retried[0].state.name == "COMPLETE"
    assert summary.worker_restarts == 1
    # the death is not a measurement (its retry is): every valid config counted once
    assert summary.shapes[0].measured == plans[0].n_valid and summary.shapes[0].status == "exhausted"
    assert summary.shapes[0].best_config == best_config
    assert summary.shapes[0].best_us == pytest.approx(best_us)


def test_hung_trial_is_killed_and_recorded_as_timeout(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    plans = plans_for("hang-test")
    hang = {"BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 2}
    monkeypatch.setenv("FAKE_HANG", search.config_key(hang))
    summary = search.run_search(plans, settings(url, trial_timeout_s=1.5))
    trials = trials_of(url, plans[0].study_name)
    hung = [t for t in trials if t.user_attrs.get("config") == hang]
    assert len(hung) == 1  # not retried: a hang costs the whole timeout
    assert hung[0].state.name == "FAIL" and hung[0].user_attrs["failure"].startswith("timeout")
    assert summary.shapes[0].status == "exhausted"


_CHILD = """
import sys
sys.path[:0] = [{tests!r}, {root!r}]
import test_search as t
from tuner import search
if __name__ == "__main__":
    plans = t.plans_for({key!r})
    search.run_search(plans, t.settings({url!r}))
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_kill9_whole_search_then_resume(backend, tmp_path, request):
    """kill -9 the search (parent and worker) mid-study; the same command again: no completed
    trial lost, the trial left RUNNING becomes FAIL (heartbeat) and is retried, and the final
    best equals an uninterrupted run's."""
    if backend == "postgres":
        url, key = request.getfixturevalue("pg")
    else:
        url, key = f"sqlite:///{tmp_path / 'studies.db'}", "kill-test"
    plans = plans_for(key)
    name = plans[0].study_name
    best_config, _ = expected_best(plans[0])
    # the best config is slow the first time: the search is killed while it runs
    env = {**os.environ, "FAKE_SLEEP": "0.05", "FAKE_SLOW": search.config_key(best_config),
           "FAKE_MARK_DIR": str(tmp_path)}
    code = _CHILD.format(tests=str(ROOT / "tests"), root=str(ROOT), key=key, url=url)
    child = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            time.sleep(0.3)
            try:
                trials = trials_of(url, name)
            except Exception:  # noqa: BLE001 - the study is not created yet
                continue
            if any(t.state.name == "RUNNING" and t.user_attrs.get("config") == best_config
                   for t in trials):
                break
        time.sleep(0.5)  # mid-trial, well past the trial's first heartbeat
        os.killpg(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    before = trials_of(url, name)
    running = [t for t in before if t.state.name == "RUNNING"]
    assert len(running) == 1 and running[0].user_attrs["config"] == best_config, state_counts(before)
    assert any(t.state.name == "COMPLETE" for t in before)
    complete = {t.number: t.value for t in before if t.state.name == "COMPLETE"}
    time.sleep(3)  # past the grace period: the heartbeat is stale

    resumed = search.run_search(plans, settings(url))
    after = {t.number: t for t in trials_of(url, name)}
    assert {n: after[n].value for n in complete} == complete  # nothing completed was lost
    stale = after[running[0].number]
    assert stale.state.name == "FAIL"
    retry = [t for t in after.values() if t.user_attrs.get("retry_of") == stale.number]
    assert len(retry) == 1
    assert retry[0].user_attrs["config"] == best_config and retry[0].state.name == "COMPLETE"

    clean_key = key + "-clean"
    clean_url = url if backend == "postgres" else f"sqlite:///{tmp_path / 'clean.db'}"
    clean = search.run_search(plans_for(clean_key), settings(clean_url))
    if backend == "postgres":
        import optuna

        optuna.delete_study(study_name=plans_for(clean_key)[0].study_name,
                            storage=search.make_storage(url, None, None))
    assert resumed.shapes[0].best_config == clean.shapes[0].best_config
    assert resumed.shapes[0].best_us == clean.shapes[0].best_us
    assert resumed.shapes[0].status == clean.shapes[0].status == "exhausted"


# ------------------------------------------------------------------------- budget and the CLI
def _table(rows):
    base = {c: 0 for c in shapetable.COLUMNS}
    base.update(op="aten::mm", family="gemm", phase="decode", dtype="bfloat16", layout="NT",
                kernels="k", source="test", device="NVIDIA H200", batch=1, steps=100,
                step_us=20000.0, step_gpu_us=18000.0, share=0.0)
    out = []
    for m, n, k, us, calls in rows:
        out.append({**base, "m": m, "n": n, "k": k, "us_per_call": us, "calls_per_step": calls,
                    "calls": int(calls * 100)})
    return pd.DataFrame(out)


def test_plan_skips_low_budget_shapes_and_weights_by_headroom():
    from tuner.device import load_profile

    table = _table([(1, 14336, 4096, 200.0, 32.0),   # far above the floor, many calls
                    (1, 4096, 4096, 40.0, 32.0),
                    (1, 256, 256, 3.0, 1.0),         # tiny: cannot move the step
                    (64, 4096, 4096, 50.0, 32.0)])   # m = 64: not a gemv shape
    plans, skipped = search.plan_studies(table, "gemv", load_profile("h200"))
    keys = [p.shape_key for p in plans]
    assert keys == ["m=1,n=14336,k=4096,dtype=bfloat16", "m=1,n=4096,k=4096,dtype=bfloat16"]
    assert [k for k, _ in skipped] == ["m=1,n=256,k=256,dtype=bfloat16"]
    assert "<" in skipped[0][1]  # the budget's reason, in words
    from tuner import budget

    judged = budget.compute(table[table["m"] == 1].reset_index(drop=True), load_profile("h200"))
    by_n = {int(r["n"]): r["headroom_us_per_token"] for _, r in judged.iterrows()}
    assert plans[0].weight == pytest.approx(by_n[14336]) and plans[1].weight == pytest.approx(by_n[4096])
    assert plans[0].study_name == "nvidia-h200:gemv:m=1,n=14336,k=4096,dtype=bfloat16"
    assert plans[0].n_valid > 0 and plans[0].default_config["SPLIT_K"] >= 1


def test_cli_search_runs_the_real_space_and_prints_skips_and_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    path = shapetable.write(_table([(1, 14336, 4096, 200.0, 32.0), (1, 256, 256, 3.0, 1.0)]),
                            tmp_path / "shapes.parquet")
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    argv = ["search", str(path), "--family", "gemv", "--device", "h200", "--storage", url,
            "--trials", "6", "--gpus", "0", "--objective", "test_search:make_fake", "--no-progress"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "skip m=1,n=256,k=256,dtype=bfloat16" in captured.err
    assert "m=1,n=14336,k=4096,dtype=bfloat16" in captured.out and "trials" in captured.out
    assert main(argv) == 0  # resume: nothing left to do
    trials = trials_of(url, "nvidia-h200:gemv:m=1,n=14336,k=4096,dtype=bfloat16")
    assert sum(t.state.name in ("COMPLETE", "FAIL") and "duplicate_of" not in t.user_attrs
               for t in trials) == 6


def test_cli_refuses_cmaes_and_bad_flags_with_one_line(tmp_path, capsys):
    path = shapetable.write(_table([(1, 14336, 4096, 200.0, 32.0)]), tmp_path / "s.parquet")
    assert main(["search", str(path), "--device", "h200", "--sampler", "cmaes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "categorical" in err[0]
    assert main(["search", str(path), "--device", "h200", "--timeout", "8 hours"]) == 2
    assert "duration" in capsys.readouterr().err
    assert units.parse_duration("1h30m") == 5400 and units.parse_duration("45") == 45
    with pytest.raises(TunerError):
        search.parse_gpus(",")


def test_gpu_objective_records_a_config_that_cannot_launch():
    """The real GPU objective (tuner.parity + tuner.bench) on the Triton interpreter: a config the
    kernel rejects is a failure with its reason, not an exception that ends the worker."""
    from tuner_kernels.gemv import default_config
    from tuner.spaces import space_for

    shape = {"m": 2, "n": 64, "k": 128, "dtype": "bfloat16"}
    plan = search.make_plan(family="gemv", shape=shape, shape_key="m=2,n=64,k=128,dtype=bfloat16",
                            device_key="interp", backend="cuda", space=space_for("gemv", "cuda"),
                            default_config=default_config(shape, "cuda"), weight=1.0)
    objective = search.GpuObjective(plan, cache="warm", groups=2, replays=1)
    result = objective.evaluate({**plan.default_config, "ROWS_PER_BLOCK": 3})
    assert result.median_us is None and not result.fatal
    assert result.failure.startswith("candidate: ValueError") and "power of two" in result.failure


def test_ctrl_c_stops_after_the_trials_in_flight(tmp_path):
    """SIGINT to the whole process group (what a terminal's Ctrl-C does): the workers finish their
    trial, the summary is printed, exit code 130, no trial is left RUNNING or failed."""
    path = shapetable.write(_table([(1, 14336, 4096, 200.0, 32.0)]), tmp_path / "shapes.parquet")
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    env = {**os.environ, "FAKE_SLEEP": "0.5",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    child = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "search", str(path), "--device", "h200", "--storage", url,
         "--trials", "40", "--gpus", "0,1", "--objective", "test_search:make_fake", "--no-progress"],
        env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    name = "nvidia-h200:gemv:m=1,n=14336,k=4096,dtype=bfloat16"
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.3)
        try:
            if sum(t.state.name == "COMPLETE" for t in trials_of(url, name)) >= 3:
                break
        except Exception:  # noqa: BLE001 - not created yet
            continue
    os.killpg(child.pid, signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert "stopping after the trials in flight" in err
    assert "stopped" in out and "interrupted: run the same command again to resume" in out
    trials = trials_of(url, name)
    assert not [t for t in trials if t.state.name in ("RUNNING", "FAIL")], state_counts(trials)
    assert 3 <= sum(t.state.name == "COMPLETE" for t in trials) < 40


def test_graph_captured_budget_keeps_the_decode_linears_of_an_eager_trace():
    """The bundled example was profiled eagerly (GPU busy ~7% of the step): against the wall step
    no gemv shape passes the default 0.5%, against the GPU-busy step (graph-captured) five do."""
    from tuner import shapetable
    from tuner.device import load_profile

    table = shapetable.read(EXAMPLE)
    profile = load_profile("h200")
    plans, skipped = search.plan_studies(table, "gemv", profile)
    assert plans == [] and skipped
    plans, _ = search.plan_studies(table, "gemv", profile, graph_captured=True)
    assert sorted(p.shape_key for p in plans) == [
        "m=4,n=128,k=896,dtype=bfloat16,bias=1", "m=4,n=4864,k=896,dtype=bfloat16",
        "m=4,n=896,k=4864,dtype=bfloat16", "m=4,n=896,k=896,dtype=bfloat16",
        "m=4,n=896,k=896,dtype=bfloat16,bias=1"]


def test_was_enqueued_reads_the_queued_params_of_a_live_trial():
    """The --trials cap puts a queued config back when its trial steps back; Optuna 5's Trial has
    no system_attrs (a worker crashed on it under PostgreSQL with two workers)."""
    import optuna

    study = optuna.create_study()
    study.enqueue_trial({"x": 1})
    queued = study.ask()
    assert search.was_enqueued(queued)
    assert not search.was_enqueued(study.ask())


def test_a_study_resumed_with_another_measurement_of_its_shape_measures_its_baseline_again(
        tmp_path):
    """One study name per served call (shape_key): a study first searched against one baseline
    (say, torch's grouped SDPA) and resumed with another (harvest --kv-heads: the repeated
    cache's) must not keep the old baseline_us; the same shape keeps it."""
    import dataclasses

    import optuna

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    plan = plans_for("resume-test")[0]
    search.prepare_studies([plan], settings(url))
    storage = search.make_storage(url, None, None)
    study = optuna.load_study(study_name=plan.study_name, storage=storage)
    study.set_user_attr("baseline_us", 9.8)
    search.prepare_studies([plan], settings(url))
    assert not study.user_attrs.get("baseline_stale")
    remeasured = dataclasses.replace(plan, shape={**plan.shape, "baseline_kv_heads": 32})
    search.prepare_studies([remeasured], settings(url))
    assert study.user_attrs["baseline_stale"] is True
    search.run_search([remeasured], settings(url, trials=1))   # the worker measures it again
    assert study.user_attrs["baseline_us"] == pytest.approx(40.0 + plan.shape["n"] / 1000.0)
    assert study.user_attrs["baseline_stale"] is False
