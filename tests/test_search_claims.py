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
    """Rule 1 with known configs (kernels/candidates.py): default, then the known ones (role
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
