"""The claims contract (tuner/search/claims.py) rule by rule, on a real SQLite study, without
workers: queue seeding once, and what read_state counts."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from tuner import search
from tuner.search import claims

from test_search import plans_for


def _study(tmp_path, plan):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    storage = search.make_storage(url, None, None)
    return optuna.create_study(study_name=plan.study_name, storage=storage), url


def test_a_study_whose_creator_died_while_seeding_is_seeded_by_the_next_supervisor(tmp_path):
    """Rule 1: the creator enqueued part of the grid, then died. The next supervisor waits for
    the marker, sees the queue stop growing, enqueues only what is missing, once."""
    plan = plans_for("seed-test")[0]
    study, _ = _study(tmp_path, plan)
    wanted = [({k: plan.default_config[k] for k in plan.space.params}, "default")]
    wanted += [(p, "grid") for p in search.startup_configs(plan, "grid", 0)]
    for params, role in wanted[:3]:
        study.enqueue_trial(params, user_attrs={"role": role})
    added = claims.seed_queue(study, plan, "grid", 0, created=False, wait_s=0.5)
    assert added == plan.n_valid - 3
    queued = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
    keys = [search.config_key(claims.trial_params(t)) for t in queued]
    assert len(keys) == len(set(keys)) == plan.n_valid
    assert [t.user_attrs["role"] for t in queued].count("default") == 1
    assert study.user_attrs[claims.QUEUE_SEEDED] is True
    assert claims.seed_queue(study, plan, "grid", 0, created=False) == 0  # once only


def test_read_state_counts_measurements_not_deaths_orphans_or_step_asides(tmp_path):
    """A retried death, an orphan and a step-aside are no measurements; the second death of a
    config is (it stands for the config); a replayed duplicate is not counted again."""
    plan = plans_for("count-test")[0]
    study, _ = _study(tmp_path, plan)
    configs = [{**plan.default_config, **p} for p in search.valid_params(plan)[:3]]

    def trial(config, state, **attrs):
        t = study.ask({k: optuna.distributions.CategoricalDistribution(v)
                       for k, v in plan.space.params.items()})
        t.set_user_attr("config", config)
        for k, v in attrs.items():
            t.set_user_attr(k, v)
        study.tell(t, 1.0 if state == TrialState.COMPLETE else None, state=state)

    trial(configs[0], TrialState.COMPLETE, median_us=1.0, parity="exact")
    trial(configs[0], TrialState.COMPLETE, duplicate_of=0)
    trial(configs[1], TrialState.FAIL, failure="worker died (signal SIGKILL)")
    trial(configs[1], TrialState.FAIL, failure=f"{claims.SKIPPED} trial 2 is measuring this config")
    trial(configs[2], TrialState.FAIL, failure=claims.ORPHAN)
    state = claims.read_state(study.get_trials(deepcopy=False), plan)
    assert state.measured == 1 and state.failed == 0
    assert set(state.known) == {search.config_key(configs[0])}
    trial(configs[1], TrialState.FAIL)  # its retry vanished too (heartbeat): the second death
    state = claims.read_state(study.get_trials(deepcopy=False), plan)
    assert state.measured == 2 and state.failed == 1
    assert search.config_key(configs[1]) in state.known
    assert state.failures == {"worker lost (heartbeat stale)": 1}


def test_known_configs_are_queued_right_after_the_default_and_read_back_in_order(tmp_path):
    """Rule 1 with known configs (tuner_kernels/candidates.py): default, then the known ones (role
    known, those outside the constraints dropped, no duplicate of the default), then the
    sampler's startup; `queued_configs` gives the full configs in that order (what a worker
    compiles ahead)."""
    from test_search import DEFAULT, SPACE

    known = [{"BLOCK_N": 64, "BLOCK_K": 64}, {"BLOCK_N": 64, "BLOCK_K": 128},  # 2nd: 8192 > 4096
             dict(DEFAULT), {"BLOCK_N": 16, "num_warps": 4}, {"BLOCK_N": 64, "BLOCK_K": 64}]
    plan = search.make_plan(family="fake", shape={"m": 1, "n": 1024, "k": 4096, "dtype": "bfloat16"},
                            shape_key="m=1,n=1024,k=4096", device_key="known-test", backend="cuda",
                            space=SPACE, default_config=DEFAULT, weight=1.0, known_configs=known)
    expected_known = [{**DEFAULT, "BLOCK_N": 64, "BLOCK_K": 64}, {**DEFAULT, "BLOCK_N": 16, "num_warps": 4}]
    assert search.known_params(plan) == expected_known
    study, _ = _study(tmp_path, plan)
    added = claims.seed_queue(study, plan, "tpe", 0, created=True)
    startup = search.startup_configs(plan, "tpe", 0)
    assert added == 1 + 2 + len(startup) and startup
    assert not any(c in expected_known or c == DEFAULT for c in startup)
    queued = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
    assert [t.user_attrs["role"] for t in queued[:4]] == ["default", "known", "known", "startup"]
    assert claims.queued_configs(study, plan)[:3] == [DEFAULT] + expected_known


def test_an_orphan_is_failed_and_requeued_but_a_trial_that_claimed_its_config_since_is_not(tmp_path):
    """Rule 6 on a list read before a slow live worker wrote its config (a loaded host): only
    the trial still without a config is failed (ORPHAN) and its queued config enqueued again
    with retry_of; its late worker's config write then fails, so it measures nothing."""
    import time

    plan = plans_for("orphan-test")[0]
    study, _ = _study(tmp_path, plan)
    params = search.valid_params(plan)[:2]
    for p in params:
        study.enqueue_trial(p, user_attrs={"role": "grid"})
    dead, slow = study.ask(), study.ask()  # both popped from the queue, neither wrote a config
    trials = study.get_trials(deepcopy=False)
    time.sleep(0.05)
    slow.set_user_attr("config", {**plan.default_config, **params[1]})  # claimed after the read
    assert claims.fail_orphans(study, trials, grace_s=0.01) == 1
    after = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert after[dead.number].state == TrialState.FAIL
    assert after[dead.number].user_attrs["failure"] == claims.ORPHAN
    assert after[slow.number].state == TrialState.RUNNING
    retry = [t for t in after.values() if t.user_attrs.get("retry_of") == dead.number]
    assert len(retry) == 1 and retry[0].state == TrialState.WAITING
    assert claims.trial_params(retry[0]) == params[0]
    try:
        dead.set_user_attr("config", {**plan.default_config, **params[0]})
    except optuna.exceptions.UpdateFinishedTrialError:
        pass
    else:
        raise AssertionError("a failed orphan's late config write went through")
    assert claims.read_state(study.get_trials(deepcopy=False), plan).measured == 0


def test_a_trial_being_failed_while_it_claims_its_config_does_not_measure(tmp_path):
    """Another process has begun failing the trial (its ``failure`` written, the state not
    yet), or has failed it: `taken` raises UpdateFinishedTrialError, so `run_trial` ends it
    "lost" instead of measuring a config whose retry is queued."""
    import pytest

    plan = plans_for("claim-race-test")[0]
    study, _ = _study(tmp_path, plan)
    params = search.valid_params(plan)[:2]
    live, half, done = (study.ask({k: optuna.distributions.CategoricalDistribution(v)
                                   for k, v in plan.space.params.items()}) for _ in range(3))
    for t, p in zip((live, half, done), (*params, params[0])):
        t.set_user_attr("config", {**plan.default_config, **p})
    key = search.config_key({**plan.default_config, **params[1]})
    assert claims.taken(half, plan, key) is None  # nobody else has it: measure
    study._storage.set_trial_user_attr(half._trial_id, "failure", claims.ORPHAN)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        claims.taken(half, plan, key)
    study._storage.set_trial_state_values(done._trial_id, TrialState.FAIL)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        claims.taken(done, plan, search.config_key({**plan.default_config, **params[0]}))
