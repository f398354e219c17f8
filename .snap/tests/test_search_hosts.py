"""Two supervisors on one PostgreSQL study set, as two hosts would run `tuner search`.

Each supervisor is its own process (its own session, as on another machine) owning half of the
(fake) GPU ids; both run the same plans against the same PostgreSQL storage. The fake objective
appends one line per *finished* measurement to FAKE_DONE_LOG, from whichever process ran it, so
the test sees exactly what was measured where. Needs the PostgreSQL server (postgres_url).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tuner import search
from tuner.search import claims

from test_search import ROOT, expected_best, pg, plans_for, state_counts, trials_of  # noqa: F401 - pg is a fixture

pytestmark = pytest.mark.postgres

SHAPES = ((1024, 2.0), (2048, 1.0), (3072, 1.0))

_SUPERVISOR = """
import json, sys
sys.path[:0] = [{tests!r}, {root!r}]
import test_search as t
from tuner import search
from tuner.search import claims
if __name__ == "__main__":
    plans = t.plans_for({key!r}, shapes={shapes!r})
    summary = search.run_search(plans, t.settings({url!r}, sampler={sampler!r}, trials={trials!r},
                                                  gpus={gpus!r}))
    print("SUMMARY " + json.dumps([[s.study_name, s.status, s.best_config, s.best_us, s.measured]
                                   for s in summary.shapes]))
"""


def _start(url, key, gpus, env, sampler="grid", trials=None):
    code = _SUPERVISOR.format(tests=str(ROOT / "tests"), root=str(ROOT), key=key, url=url,
                              shapes=SHAPES, sampler=sampler, trials=trials, gpus=gpus)
    return subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _summary(child, timeout=180):
    out, err = child.communicate(timeout=timeout)
    assert child.returncode == 0, err[-3000:]
    line = [x for x in out.splitlines() if x.startswith("SUMMARY ")][-1]
    return {name: (status, config, us, measured)
            for name, status, config, us, measured in json.loads(line[len("SUMMARY "):])}


def _measured(log) -> list[tuple[str, str]]:
    if not log.exists():
        return []
    return [tuple(line.split("\t")[:2]) for line in log.read_text().splitlines()]


def _all_trials(url, plans):
    return {p.study_name: trials_of(url, p.study_name) for p in plans}


def test_two_supervisors_share_one_postgres_search_and_survive_a_kill9(pg, tmp_path):
    """Supervisor A (GPUs 0,1) and B (GPUs 2,3) start the same grid search at the same moment;
    A is killed with kill -9 (its whole process group) in the middle of a trial (FAKE_HOLD: one
    of A's evaluations, started a quarter of the way in, never returns) and started
    again while B goes on. Every valid config of every study is measured exactly once over the
    whole night (the trial A was measuring is retried, not lost), the queue was seeded once,
    nothing is left RUNNING, and both supervisors finish the same studies with the same best."""
    url, key = pg
    plans = plans_for(key, shapes=SHAPES)
    log = tmp_path / "measured.tsv"
    env = {**os.environ, "FAKE_SLEEP": "0.5", "FAKE_DONE_LOG": str(log)}
    total = sum(p.n_valid for p in plans)
    hold = tmp_path / "held.tsv"  # A's workers: one evaluation, a quarter in, never returns
    a = _start(url, key, ["0", "1"], {**env, "FAKE_HOLD": str(hold),
                                      "FAKE_HOLD_AFTER": str(total // 4)})
    b = _start(url, key, ["2", "3"], env)
    deadline = time.time() + 120
    try:
        while not hold.exists() or not hold.read_text().endswith("\n"):
            assert a.poll() is None and time.time() < deadline, (
                f"supervisor A never started a measurement after {total // 4} were done "
                f"({len(_measured(log))} of {total} measured, A exit {a.poll()})")
            time.sleep(0.05)
        held = tuple(hold.read_text().rstrip("\n").split("\t"))  # (study, config key)
        os.killpg(a.pid, signal.SIGKILL)  # in the middle of measuring `held`
        a.wait(timeout=30)
        a2 = _start(url, key, ["0", "1"], env)  # the same command again on "host A"
        second, first = _summary(a2), _summary(b)
    finally:
        for child in (a, b):
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)

    # Each config measured once. A's held evaluation never finished, so its config was measured
    # by the retry only. The one exception is A's other worker: if its measurement had finished
    # but was not stored yet when A died (the few ms between the objective's return and Optuna's
    # tell), the retry measures it again; it is never lost.
    measured = _measured(log)
    by_study = _all_trials(url, plans)
    # What A was measuring when it died: its claimed trials the heartbeat check failed and
    # queued again (read afterwards: under load, B's check may fail them before a read after
    # the kill could see them RUNNING).
    victim = [(name, t) for name, ts in by_study.items() for t in ts
              if f"/{a.pid}/" in str(t.user_attrs.get("worker", "")) and "config" in t.user_attrs
              and any(r.user_attrs.get("retry_of") == t.number for r in ts)]
    assert held in {
        (name, search.config_key(t.user_attrs["config"])) for name, t in victim}, _held_trials(
            by_study, held)
    killed = {(name, search.config_key(t.user_attrs["config"])) for name, t in victim}
    assert set(measured) == {(p.study_name, k) for p in plans for k in p.valid_keys}
    twice = {m for m in measured if measured.count(m) > 1}
    assert held not in twice, _twice(measured, by_study)
    assert twice <= killed and len(measured) <= total + len(killed), _twice(measured, by_study)
    for plan in plans:  # in the storage: one trial stands for each config, a measured one
        trials = by_study[plan.study_name]
        state = search.read_state(trials, plan)
        assert set(state.known) == set(plan.valid_keys)
        ran = [search.config_key(t.user_attrs["config"]) for t in trials if _stored(t)]
        assert sorted(ran) == sorted(plan.valid_keys), _twice(measured, by_study)
    for plan in plans:
        trials = by_study[plan.study_name]
        assert state_counts(trials).get("RUNNING", 0) == 0, state_counts(trials)
        assert [t.user_attrs.get("role") for t in trials].count("default") == 1
        assert [t.user_attrs.get("role") for t in trials].count("grid") == plan.n_valid - 1
        config, us = expected_best(plan)
        for summary in (first, second):
            assert summary[plan.study_name][:3] == ("exhausted", config, pytest.approx(us))
    # what A was measuring when it was killed: failed by the heartbeat check, retried once
    for name, lost in victim:
        after = {t.number: t for t in by_study[name]}
        assert after[lost.number].state.name == "FAIL"
        retry = _retry_of(after, lost)
        if retry.state.name == "WAITING":  # another trial measured the config first (see below)
            key = search.config_key(lost.user_attrs["config"])
            assert [t for t in after.values() if _stored(t)
                    and search.config_key(t.user_attrs["config"]) == key], _held_trials(
                        by_study, (name, key), "a retry left queued, its config never measured")
        else:
            assert retry.user_attrs["config"] == lost.user_attrs["config"]
            assert retry.state.name in ("COMPLETE", "FAIL")
    hosts = {str(t.user_attrs.get("worker", "")).split("/")[1] for ts in by_study.values()
             for t in ts if "worker" in t.user_attrs}
    assert {str(a.pid), str(b.pid), str(a2.pid)} <= hosts  # all three supervisors measured


def _retry_of(trials: dict, lost):
    """The one trial that took `lost`'s config again, or the retry still queued at the end.

    Under load a retry's worker may be slower than the grace period between asking the trial
    and writing its config: claims rule 6 then fails that retry as an orphan (no config) and
    queues the config once more (retry_of the retry), so the chain is followed through such
    orphans. A retry can also stay queued (WAITING): a worker that found the grid queue empty
    drew the same config at random, decided in the moment between the death's FAIL and the
    retry's enqueue, saw no trial standing for it and measured it; the study was then done
    without the retry (measured once all the same; a later run answers it as a duplicate)."""
    chain = [lost]
    while True:
        retries = [t for t in trials.values() if t.user_attrs.get("retry_of") == chain[-1].number]
        assert len(retries) == 1, f"trial {chain[-1].number} retried {len(retries)} times"
        chain.append(retries[0])
        if "config" in retries[0].user_attrs or retries[0].state.name == "WAITING":
            return retries[0]
        assert retries[0].state.name == "FAIL", (retries[0].number, retries[0].state.name)
        assert retries[0].user_attrs.get("failure") == claims.ORPHAN, retries[0].user_attrs
        assert len(chain) < 10, [t.number for t in chain]


def _held_trials(by_study, held, why="the held trial was not retried") -> str:
    """The trials of the held config, for the failure message."""
    study, config = held
    return f"{why}: " + "; ".join(_trials_of_config(by_study, study, config))


def _trials_of_config(by_study, study, config) -> list[str]:
    """One line per trial of `study` with `config` (a config key), for failure messages."""
    return [f"{study} #{t.number} {t.state.name} start={t.datetime_start} "
            f"end={t.datetime_complete} "
            + json.dumps({k: v for k, v in t.user_attrs.items() if k != "config"})
            for t in by_study.get(study, [])
            if search.config_key(t.user_attrs.get("config") or {}) == config]


def _stored(trial) -> bool:
    """A trial whose measurement is stored: COMPLETE, or FAIL with a candidate's reason; not a
    duplicate, a step-aside, an orphan or a trial whose worker vanished (no reason)."""
    failure = str(trial.user_attrs.get("failure", ""))
    if "duplicate_of" in trial.user_attrs or trial.state.name not in ("COMPLETE", "FAIL"):
        return False
    if trial.state.name == "FAIL":
        return bool(failure) and not failure.startswith((search.SKIPPED, "worker died"))
    return True


def _twice(measured, by_study) -> str:
    """The trials of each config measured more than once, for the failure message."""
    lines = []
    for study, config in {m for m in measured if measured.count(m) > 1}:
        lines += _trials_of_config(by_study, study, config)
    return "measured twice:\n" + "\n".join(lines)


def test_two_supervisors_tpe_with_a_trials_cap_neither_overshoot_nor_repeat(pg, tmp_path):
    """TPE with --trials 12 on both supervisors at once: each study gets exactly 12 measured
    trials between them (the cap holds across hosts) and no config is measured twice."""
    url, key = pg
    plans = plans_for(key, shapes=SHAPES[:2])
    log = tmp_path / "measured.tsv"
    env = {**os.environ, "FAKE_SLEEP": "0.2", "FAKE_DONE_LOG": str(log)}
    a = _start(url, key, ["0", "1"], env, sampler="tpe", trials=12)
    b = _start(url, key, ["2", "3"], env, sampler="tpe", trials=12)
    try:
        first, second = _summary(a), _summary(b)
    finally:
        for child in (a, b):
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
    measured = [m for m in _measured(log) if m[0] in {p.study_name for p in plans}]
    assert len(measured) == len(set(measured))
    for plan in plans:
        assert sum(1 for s, _ in measured if s == plan.study_name) == 12
        assert first[plan.study_name][0] == second[plan.study_name][0] == "trials"
        assert first[plan.study_name][3] == second[plan.study_name][3] == 12
        assert first[plan.study_name][2] == second[plan.study_name][2]
