"""tuner rank: the decision logic on recorded trial data, and the study -> verdict path.

The studies are real Optuna studies in SQLite with the pinned user attrs (docs/interfaces.md). The
GPU measurement stands behind the swappable `measure` function; here it replays recorded numbers
(parity results and paired timings), so every gate is exercised: winner, runner-up, noise,
not faster, parity failure, too small, failed candidate. Expected numbers are worked by hand.
"""

from __future__ import annotations

import json
import math


import optuna  # noqa: E402
import pytest  # noqa: E402

from tuner import parity, rank  # noqa: E402
from tuner.cli import main  # noqa: E402
from tuner.errors import TunerError  # noqa: E402
from tuner import units  # noqa: E402

from conftest import needs_cxx  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)

# The decode step of the bundled example (Qwen2.5-0.5B, batch 4) as budget sees it under graphs:
# GPU busy 2198 us per step; the m=4 n=4864 k=896 projection runs 48 times a step.
STEP_US = 2198.0


def study_info(shape_key="m=4,n=4864,k=896,dtype=bfloat16", calls=48.0, step_us=STEP_US,
               hit_rate=1.0) -> rank.StudyInfo:
    m, n, k = (int(part.split("=")[1]) for part in shape_key.split(",")[:3])
    return rank.StudyInfo(name=f"nvidia-h200:gemv:{shape_key}", family="gemv",
                          shape={"m": m, "n": n, "k": k, "dtype": "bfloat16"},
                          shape_key=shape_key, device="nvidia-h200", calls_per_step=calls,
                          step_us=step_us, hit_rate=hit_rate, phase="decode")


def cand(rows, trial=0, search_us=4.0) -> rank.Candidate:
    return rank.Candidate(config={"ROWS_PER_BLOCK": rows, "BLOCK_K": 256, "SPLIT_K": 1,
                                  "num_warps": 4, "num_stages": 2},
                          search_us=search_us, trial=trial)


def facts(*, accurate=True, err=1.6e-3, in_default=True, bitwise_base=False):
    """Recorded parity facts: error `err` against the reference, 1.05x (accurate) or 2x the
    serving path's own error."""
    ratio = 1.05 if accurate else 2.0
    return parity.ParityFacts(bitwise_base, in_default, "a1b2c3d4e5f60718",
                              "a1b2c3d4e5f60718" if in_default else "0000aaaa1111bbbb",
                              err, err / ratio, ratio, 0, 3)


def measured(c, *, base, cand_us, low, high, noise=0.6, parity=True, err=1.6e-3,
             default_us=None, failure="", in_default=True) -> rank.Measured:
    return rank.Measured(
        config=c.config,
        parity=facts(accurate=parity, err=err, in_default=in_default),
        vs_baseline=rank.Pair(base, cand_us, base / cand_us, low, high, noise),
        vs_default=(rank.Pair(default_us, cand_us, default_us / cand_us,
                              default_us / cand_us - 0.02, default_us / cand_us + 0.02, noise)
                    if default_us else None),
        failure=failure)


def test_winner_numbers_worked_by_hand():
    s = study_info()
    c = cand(8)
    table = rank.decide([(s, [(c, measured(c, base=4.80, cand_us=4.00, low=1.17, high=1.23,
                                            default_us=4.40))])], threshold="0.5%")
    row = table.iloc[0]
    assert row["decision"] == "accept" and row["rank"] == 1
    # saving a call: 4.80 - 4.00 = 0.80 us; x 48 calls x hit rate 1 = 38.4 us per token;
    # 38.4 / 2198 = 1.747% of the step >= 0.5%
    assert row["saving_us_per_call"] == pytest.approx(0.80)
    assert row["saving_us_per_token"] == pytest.approx(38.4)
    assert row["share_of_step"] == pytest.approx(38.4 / 2198.0)
    assert row["speedup"] == pytest.approx(1.2)
    assert row["speedup_vs_default"] == pytest.approx(1.1)
    assert row["parity_mode"] == "accuracy" and row["parity"].startswith("accuracy ok")
    # the three facts, whatever the gate
    assert row["bitwise_vs_baseline"] is False or row["bitwise_vs_baseline"] == False  # noqa: E712
    assert row["bitwise_vs_default"] and row["parity_class"] == row["default_class"]
    assert row["error_ratio"] == pytest.approx(1.05) and row["parity_seeds"] == 3
    assert json.loads(row["config"])["ROWS_PER_BLOCK"] == 8
    assert list(table.columns[:len(rank.VERDICT_COLUMNS)]) == rank.VERDICT_COLUMNS


def test_hit_rate_scales_the_projection():
    s = study_info(hit_rate=0.5)
    c = cand(8)
    row = rank.decide([(s, [(c, measured(c, base=4.80, cand_us=4.00, low=1.17,
                                         high=1.23))])]).iloc[0]
    assert row["saving_us_per_token"] == pytest.approx(0.80 * 48 * 0.5)


def test_noisy_candidate_is_rejected_for_noise():
    s = study_info()
    c = cand(4)
    # median 1.02x, but the confidence bound reaches down to 0.995
    row = rank.decide([(s, [(c, measured(c, base=4.80, cand_us=4.706, low=0.995, high=1.04,
                                         noise=1.8))])]).iloc[0]
    assert row["decision"] == "reject"
    assert row["reason"].startswith("noise:")
    assert "0.995" in row["reason"] and "1.8" in row["reason"]


def test_slower_candidate_is_rejected_as_not_faster():
    s = study_info()
    c = cand(1)
    row = rank.decide([(s, [(c, measured(c, base=4.80, cand_us=5.30, low=0.89, high=0.92))])]
                      ).iloc[0]
    assert row["decision"] == "reject" and row["reason"].startswith("not faster:")
    assert row["saving_us_per_token"] == pytest.approx((4.80 - 5.30) * 48)


def test_parity_failure_is_rejected_whatever_its_speed():
    s = study_info()
    c = cand(8)
    m = measured(c, base=4.80, cand_us=3.00, low=1.55, high=1.65, parity=False, err=2.4e-3)
    row = rank.decide([(s, [(c, m)])]).iloc[0]
    assert row["decision"] == "reject" and row["reason"].startswith("parity:")
    assert "2.00x the serving path's" in row["reason"]
    assert row["parity_error"] == pytest.approx(2.4e-3)
    assert "FAILED" in row["parity"]


def test_the_gate_decides_and_every_row_shows_all_three_facts():
    s = study_info()
    c = cand(8)
    outside = measured(c, base=4.80, cand_us=4.00, low=1.17, high=1.23, err=3.1e-3,
                       in_default=False)
    accepted = rank.decide([(s, [(c, outside)])]).iloc[0]  # accuracy (default): accepted
    assert accepted["decision"] == "accept" and "3.10e-03" in accepted["parity"]
    kernel = rank.decide([(s, [(c, outside)])], gate="kernel").iloc[0]
    assert kernel["decision"] == "reject" and kernel["parity_mode"] == "kernel"
    assert "differs from the default config's" in kernel["reason"]
    for row in (accepted, kernel):
        assert not row["bitwise_vs_default"] and row["default_class"] == "0000aaaa1111bbbb"
    legacy = rank.decide([(s, [(c, outside)])], gate="exact").iloc[0]  # deprecated alias
    assert legacy["parity_mode"] == "kernel"


def test_slower_than_the_default_config_is_rejected():
    # beats the baseline (4.80 -> 4.40 us) but the untuned default config runs 4.00 us: the
    # loader's fallback would be faster than this export
    s = study_info()
    c = cand(16)
    m = measured(c, base=4.80, cand_us=4.40, low=1.08, high=1.10)
    m.vs_default = rank.Pair(4.00, 4.40, 4.00 / 4.40, 0.90, 0.92, 0.6)
    row = rank.decide([(s, [(c, m)])]).iloc[0]
    assert row["decision"] == "reject"
    assert row["reason"].startswith("slower than the default config: 0.909x")


def test_the_default_config_is_not_rejected_against_itself():
    """Measured on the H200 (attention, kv_len 130): the default config, re-measured against the
    default, gave 0.999x [0.999, 1.000] — an A/A pair — and was rejected as slower than itself."""
    s = study_info()
    c = cand(16)
    s.default_config = dict(c.config)
    m = measured(c, base=4.88, cand_us=4.37, low=1.114, high=1.116)
    m.vs_default = rank.Pair(4.37, 4.372, 4.37 / 4.372, 0.9990, 0.9998, 0.6)
    row = rank.decide([(s, [(c, m)])], threshold="1us").iloc[0]
    assert row["decision"] == "accept", row["reason"]


def test_too_small_saving_is_rejected():
    # the lm_head of the example: 1 call per step; 65.25 -> 62.0 us is a real 1.05x ...
    s = study_info("m=4,n=151936,k=896,dtype=bfloat16", calls=1.0)
    c = cand(8)
    row = rank.decide([(s, [(c, measured(c, base=65.25, cand_us=62.0, low=1.04, high=1.06))])],
                      threshold="0.5%").iloc[0]
    # ... but 3.25 us per token is 0.148% of a 2198 us step < 0.5%
    assert row["decision"] == "reject" and row["reason"].startswith("too small:")
    assert row["saving_us_per_token"] == pytest.approx(3.25)
    # an absolute threshold below it accepts the same numbers
    row = rank.decide([(s, [(c, measured(c, base=65.25, cand_us=62.0, low=1.04, high=1.06))])],
                      threshold="3us").iloc[0]
    assert row["decision"] == "accept"


def test_failed_candidate_keeps_its_reason():
    s = study_info()
    c = cand(8)
    m = rank.Measured(config=c.config, failure="out of resources: shared memory 263168 > 232448")
    row = rank.decide([(s, [(c, m)])]).iloc[0]
    assert row["decision"] == "reject"
    assert row["reason"] == "failed: out of resources: shared memory 263168 > 232448"
    assert math.isnan(row["saving_us_per_token"])


def test_ranked_by_saving_per_token_not_by_ratio():
    # A: 1.60x but one call per step -> 8.0 - 5.0 = 3.0 us/token
    # B: 1.10x on 48 calls per step -> (4.40 - 4.00) x 48 = 19.2 us/token
    a, b = study_info("m=4,n=151936,k=896,dtype=bfloat16", calls=1.0), study_info()
    ca, cb = cand(8, trial=1), cand(4, trial=2)
    table = rank.decide([
        (a, [(ca, measured(ca, base=8.0, cand_us=5.0, low=1.55, high=1.65))]),
        (b, [(cb, measured(cb, base=4.40, cand_us=4.00, low=1.08, high=1.12))]),
    ], threshold="1us")
    assert list(table["shape"]) == [b.shape_key, a.shape_key]
    assert list(table["rank"]) == [1, 2]
    assert table["saving_us_per_token"].tolist() == pytest.approx([19.2, 3.0])


def test_one_winner_per_shape_others_are_runners_up():
    s = study_info()
    c1, c2, c3 = cand(8, trial=3), cand(4, trial=7), cand(2, trial=9)
    table = rank.decide([(s, [
        (c1, measured(c1, base=4.80, cand_us=4.10, low=1.15, high=1.19)),
        (c2, measured(c2, base=4.80, cand_us=4.00, low=1.18, high=1.22)),
        (c3, measured(c3, base=4.80, cand_us=4.75, low=0.99, high=1.03)),
    ])])
    assert table["decision"].tolist() == ["accept", "runner-up", "reject"]
    assert json.loads(table.iloc[0]["config"])["ROWS_PER_BLOCK"] == 4  # the faster one
    assert table["rank"].tolist() == [1, 0, 0]


def test_threshold_text_follows_budget():
    assert units.parse_threshold("0.5%") == units.Threshold(share=0.005)
    assert units.parse_threshold("40us") == units.Threshold(us_per_token=40.0)
    assert units.parse_threshold("0.04ms") == units.Threshold(us_per_token=40.0)
    assert units.parse_threshold(None) == units.Threshold(share=0.005)
    with pytest.raises(TunerError):
        units.parse_threshold("lots")


# ------------------------------------------------------------------- studies -> rank -> files
def make_study(url, shape_key, calls, trials):
    """A study as tuner search leaves it: pinned study attrs, trials with the pinned user attrs."""
    m, n, k = (int(p.split("=")[1]) for p in shape_key.split(",")[:3])
    study = optuna.create_study(study_name=f"nvidia-h200:gemv:{shape_key}", storage=url)
    attrs = {"family": "gemv", "shape": {"m": m, "n": n, "k": k, "dtype": "bfloat16"},
             "shape_key": shape_key, "device": "nvidia-h200", "backend": "cuda",
             "baseline_us": 4.8, "default_us": 4.4, "calls_per_step": calls, "step_us": STEP_US,
             "hit_rate": 1.0, "phase": "decode", "source": "shapes/examples"}
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    for config, us, parity, state in trials:
        user = {"config": config, "median_us": us, "noise_pct": 0.6, "output_hash": "ab" * 8,
                "parity": parity, "rel_err": 0.0}
        if state == "fail":
            user["failure"] = "compile error"
            study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL,
                                                      user_attrs=user, params={}, distributions={}))
        else:
            constraints = {"space": 0.0, "parity": 1.0 if state == "infeasible" else 0.0}
            study.add_trial(optuna.trial.create_trial(value=us, user_attrs=user, params={},
                                                      distributions={}, constraints=constraints))
    return study


def cfg(rows, block_k=256):
    return {"ROWS_PER_BLOCK": rows, "BLOCK_K": block_k, "SPLIT_K": 1, "num_warps": 4,
            "num_stages": 2}


@pytest.fixture
def storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    make_study(url, "m=4,n=4864,k=896,dtype=bfloat16", 48.0, [
        (cfg(8), 4.00, "exact", "ok"),
        (cfg(8), 4.02, "exact", "ok"),          # the same config again: one candidate
        (cfg(1), 3.50, "mismatch", "ok"),       # fastest but infeasible (parity)
        (cfg(4), 4.10, "exact", "ok"),
        (cfg(2), 4.30, "exact", "ok"),
        (cfg(16), 4.60, "exact", "ok"),         # 4th distinct: not re-measured with top=3
        (cfg(32), 0.0, "exact", "fail"),        # failed trial
        (cfg(64), 3.90, "exact", "infeasible"),  # parity constraint violated (Optuna 5 API)
    ])
    make_study(url, "m=4,n=896,k=4864,dtype=bfloat16", 24.0, [
        (cfg(2, 512), 6.20, "exact", "ok"),
    ])
    return url


def recorded_measure(records):
    calls = []

    def measure(study, candidate, parity_mode):
        calls.append((study.shape_key, candidate.config["ROWS_PER_BLOCK"], parity_mode))
        return records[(study.shape_key, candidate.config["ROWS_PER_BLOCK"])](candidate)

    return measure, calls


def test_best_distinct_feasible_configs(storage):
    studies = rank.load_studies(storage, family="gemv", device="nvidia-h200", top=3)
    by_key = {s.shape_key: s for s in studies}
    first = by_key["m=4,n=4864,k=896,dtype=bfloat16"]
    assert [c.config["ROWS_PER_BLOCK"] for c in first.candidates] == [8, 4, 2]
    assert [c.search_us for c in first.candidates] == [4.00, 4.10, 4.30]
    assert first.calls_per_step == 48.0 and first.step_us == STEP_US
    with pytest.raises(TunerError, match="no tuner studies"):
        rank.load_studies(storage, family="attention")
    with pytest.raises(TunerError, match="no tuner studies"):
        rank.load_studies(storage, device="amd-instinct-mi300x")


def test_rank_with_swapped_measurement_writes_the_table(storage, tmp_path):
    big, small = "m=4,n=4864,k=896,dtype=bfloat16", "m=4,n=896,k=4864,dtype=bfloat16"
    records = {
        (big, 8): lambda c: measured(c, base=4.80, cand_us=4.00, low=1.17, high=1.23),
        (big, 4): lambda c: measured(c, base=4.80, cand_us=4.70, low=0.99, high=1.05, noise=2.0),
        (big, 2): lambda c: measured(c, base=4.80, cand_us=4.50, low=1.05, high=1.08,
                                     parity=False, err=1e-3),
        (small, 2): lambda c: rank.Measured(config=c.config, failure="illegal memory access"),
    }
    measure, calls = recorded_measure(records)
    ident = {"device_name": "NVIDIA H200", "arch": "sm90", "backend": "cuda", "torch": "2.11.0",
             "triton": "3.6.0", "kernel_hash": "0123456789abcdef", "fp_fusion": True}
    table = rank.rank(storage, family="gemv", device="nvidia-h200", measure=measure,
                      identity=lambda family: ident, progress=False)
    assert sorted(calls) == sorted([(big, 8, "accuracy"), (big, 4, "accuracy"), (big, 2, "accuracy"),
                                    (small, 2, "accuracy")])
    assert table["decision"].tolist() == ["accept", "reject", "reject", "reject"]
    reasons = " | ".join(table["reason"])
    assert "noise:" in reasons and "parity:" in reasons and "failed: illegal memory" in reasons
    assert (table["device_name"] == "NVIDIA H200").all() and table["measured_at"].str.len().min() > 0

    parquet, md = rank.write(table, tmp_path / "verdicts", "nvidia-h200-gemv")
    back = rank.read(parquet)
    assert back["decision"].tolist() == table["decision"].tolist()
    text = md.read_text()
    assert "| 1 | m=4,n=4864,k=896,dtype=bfloat16 | gemv |" in text
    assert "failed: illegal memory access" in text
    lines = rank.summary_lines(table)
    assert "38.40 us/token" in lines[1]
    assert any("3 candidate(s) rejected" in line for line in lines)


def _gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_gpu_visible(), reason="checks the message on a machine without a GPU")
def test_rank_cli_without_gpu_says_so(storage, capsys):
    rc = main(["rank", "--storage", storage, "--family", "gemv"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("tuner: error:") and "GPU" in err and "Traceback" not in err


def test_rank_missing_storage_is_one_line(tmp_path, capsys):
    rc = main(["rank", "--storage", str(tmp_path / "none.db"), "--device", "nvidia-h200"])
    err = capsys.readouterr().err
    assert rc == 2 and "no study storage" in err and err.count("\n") == 1


@pytest.mark.slow
def test_real_measurement_path_under_the_interpreter(tmp_path, monkeypatch):
    """rank's own measurement (tuner.parity + tuner.bench) on the CPU under TRITON_INTERPRET=1:
    the interpreter is far slower than torch's linear, so the default config is 'not faster';
    a config the kernel cannot launch is 'failed' with the kernel's own message."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from tuner_kernels.gemv import default_config

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    shape = {"m": 2, "n": 40, "k": 64, "dtype": "bfloat16"}
    make_study(url, "m=2,n=40,k=64,dtype=bfloat16", 48.0, [
        (default_config(shape, "cuda"), 500.0, "exact", "ok"),
        ({**cfg(3, 32), "num_warps": 1}, 400.0, "exact", "ok"),  # ROWS_PER_BLOCK=3 cannot launch
    ])
    ident = {"device_name": "cpu", "arch": "", "backend": "cuda", "torch": "", "triton": "",
             "kernel_hash": "", "fp_fusion": True}
    table = rank.rank(url, family="gemv", progress=False, identity=lambda family: ident,
                      measure=rank.make_measure(device="cpu", cache="warm", groups=2, replays=1,
                                                min_calls=1))
    by_rows = {json.loads(c)["ROWS_PER_BLOCK"]: r for c, r in zip(table["config"],
                                                                   table.to_dict("records"))}
    failed = by_rows[3]
    assert failed["reason"].startswith("failed:") and "power of two" in failed["reason"]
    ok = by_rows[default_config(shape, "cuda")["ROWS_PER_BLOCK"]]
    assert ok["parity"].startswith("accuracy ok") and ok["bitwise_vs_default"]
    assert ok["baseline_us"] > 0 and ok["candidate_us"] > ok["baseline_us"]
    assert ok["reason"].startswith("not faster:") and ok["decision"] == "reject"


@pytest.mark.gpu
def test_measure_on_gpu_real_gemv():
    """On a GPU: the default config re-measured against the baseline gives a full row."""
    from tuner_kernels.gemv import default_config

    s = study_info("m=4,n=4864,k=896,dtype=bfloat16")
    c = rank.Candidate(config=default_config(s.shape, "cuda"), search_us=0.0, trial=0)
    m = rank.measure_on_gpu(s, c, "exact")
    assert not m.failure and m.parity.bitwise_vs_default  # the default config's own class
    assert m.vs_baseline.reference_us > 0 and m.vs_baseline.candidate_us > 0
    assert m.vs_default.speedup_low <= 1.0 + 0.05
    row = rank.decide([(s, [(c, m)])]).iloc[0]
    assert row["decision"] in ("accept", "reject")


def test_study_without_a_feasible_trial_keeps_a_row(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    make_study(url, "m=4,n=896,k=896,dtype=bfloat16", 48.0, [
        (cfg(8), 3.9, "mismatch", "ok"),
        (cfg(4), 0.0, "exact", "fail"),
        (cfg(2), 0.0, "exact", "fail"),
    ])
    measure, calls = recorded_measure({})
    table = rank.rank(url, family="gemv", measure=measure, progress=False,
                      identity=lambda family: {})
    assert calls == []
    assert len(table) == 1
    row = table.iloc[0]
    assert row["decision"] == "reject" and row["shape"] == "m=4,n=896,k=896,dtype=bfloat16"
    assert row["reason"] == ("no candidate: no feasible completed trial in the study "
                             "(3 trials: 1 complete, 2 failed, 1 parity mismatch)")


def test_the_default_config_is_always_a_candidate():
    """When the search measured the default config feasible but slower than its top few (a few
    µs are noisy), rank still re-measures it: on the H200 it beat every top-3 candidate of the
    q/o projection, which was then left with no accepted config."""
    import optuna

    def trial(config, us, parity="exact"):
        return optuna.trial.create_trial(
            params={}, distributions={}, value=us, state=optuna.trial.TrialState.COMPLETE,
            user_attrs={"config": config, "median_us": us, "parity": parity})

    default = cfg(16)
    trials = [trial(cfg(1), 3.1), trial(cfg(2), 3.2), trial(cfg(4), 3.3), trial(default, 3.4)]
    assert [c.config["ROWS_PER_BLOCK"] for c in rank.best_distinct(trials, 3)] == [1, 2, 4]
    with_default = rank.best_distinct(trials, 3, default)
    assert [c.config["ROWS_PER_BLOCK"] for c in with_default] == [1, 2, 4, 16]
    assert with_default[-1].search_us == 3.4
    # already among the best: not twice; never measured feasible: not added
    assert len(rank.best_distinct(trials, 3, cfg(2))) == 3
    assert len(rank.best_distinct(trials[:3], 3, default)) == 3


CPU_IDENT = {"device_name": "cpu", "arch": "", "backend": "cuda", "torch": "", "triton": "",
             "kernel_hash": "", "fp_fusion": True}
CPU_TIMING = dict(device="cpu", cache="warm", groups=2, replays=1, min_calls=1)


def _tiny_gemv_study(tmp_path, monkeypatch):
    """(url, study, shape): one tiny gemv study with its default config, for rank's own
    measurement on the CPU under the interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from tuner_kernels.gemv import default_config

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    shape = {"m": 2, "n": 40, "k": 64, "dtype": "bfloat16"}
    study = make_study(url, "m=2,n=40,k=64,dtype=bfloat16", 48.0,
                       [(default_config(shape, "cuda"), 500.0, "exact", "ok")])
    return url, study, shape


def _spy_compiled_baseline(monkeypatch) -> list:
    """The names of the families tuner.bench builds a compiled baseline for, from now on."""
    from tuner import bench

    compiled_for = []
    compiled_baseline = bench.compiled_baseline

    def spy(family, *mode):
        compiled_for.append(family.name)
        return compiled_baseline(family, *mode)

    monkeypatch.setattr(bench, "compiled_baseline", spy)
    return compiled_for


@needs_cxx
def test_rank_can_time_the_baseline_compiled(tmp_path, monkeypatch):
    """--compiled-baseline: the baseline is timed under torch.compile (Inductor, here on the CPU),
    the table says so in `baseline_path`, and export carries it into the entry; the default
    stays eager."""
    url, _, _ = _tiny_gemv_study(tmp_path, monkeypatch)
    compiled_for = _spy_compiled_baseline(monkeypatch)
    compiled = rank.rank(url, family="gemv", progress=False, identity=lambda family: CPU_IDENT,
                         measure=rank.make_measure(baseline="compiled-baseline", **CPU_TIMING),
                         compiled_baseline=True)
    assert compiled_for == ["gemv"]  # the baseline pair's reference was the compiled baseline
    eager = rank.rank(url, family="gemv", progress=False, identity=lambda family: CPU_IDENT,
                      measure=rank.make_measure(**CPU_TIMING))
    assert compiled_for == ["gemv"]
    assert list(compiled[rank.BASELINE_PATH]) == ["torch.compile"]
    assert list(eager[rank.BASELINE_PATH]) == ["eager"]
    for table in (compiled, eager):
        row = table.iloc[0]
        assert row["baseline_us"] > 0 and row["parity"].startswith("accuracy ok")
    from tuner import export

    compiled["decision"] = "accept"  # the interpreter is never faster: export it anyway
    compiled["rank"] = 1
    doc = export.family_document(compiled, "gemv", "cpu", check_kernel_hash=False)
    assert [e["measured"]["baseline_path"] for e in doc["configs"].values()] == ["torch.compile"]


@needs_cxx
def test_a_study_of_a_compiled_step_is_timed_against_the_compiled_baseline(tmp_path,
                                                                           monkeypatch):
    """A study whose shape says baseline_compiled (its rows came from a torch.compile'd step's
    trace: harvest's traced_compiled) gets its baseline timed under torch.compile without any
    flag, and its rows say so."""
    url, study, shape = _tiny_gemv_study(tmp_path, monkeypatch)
    study.set_user_attr("shape", dict(shape, baseline_compiled=1))
    compiled_for = _spy_compiled_baseline(monkeypatch)
    table = rank.rank(url, family="gemv", progress=False, identity=lambda family: CPU_IDENT,
                      measure=rank.make_measure(**CPU_TIMING))
    assert compiled_for == ["gemv"]  # the baseline pair's reference, resolved by tuner.bench
    assert list(table[rank.BASELINE_PATH]) == ["torch.compile"]
    assert table.iloc[0]["baseline_us"] > 0


def test_rank_baseline_names_reach_the_gpu_measurement(tmp_path, monkeypatch):
    """`tuner rank --baseline X` (rank(baseline=X); --compiled-baseline, rank(compiled_baseline=
    True), is 'compile'), no custom measure: every study's pair is timed against that reference
    of tuner.bench; without either, the eager one."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    make_study(url, "m=4,n=896,k=896,dtype=bfloat16", 48.0, [(cfg(2), 3.9, "exact", "ok")])
    asked = []

    def measure_on_gpu(study, cand, gate, *, baseline="baseline", **options):
        asked.append(baseline)
        return rank.Measured(config=cand.config, parity=None)

    monkeypatch.setattr(rank, "_require_gpu", lambda: None)
    monkeypatch.setattr(rank, "measure_on_gpu", measure_on_gpu)
    ident = lambda family: {}  # noqa: E731
    rank.rank(url, family="gemv", progress=False, identity=ident, compiled_baseline=True)
    for name in ("max-autotune", "compile", "eager", ""):
        rank.rank(url, family="gemv", progress=False, identity=ident, baseline=name)
    assert asked == ["compiled-baseline", "max-autotune-baseline", "compiled-baseline",
                     "baseline", "baseline"]
    with pytest.raises(TunerError, match="unknown baseline"):
        rank.rank(url, family="gemv", progress=False, identity=ident, baseline="fastest")


# ------------------------------------------------------------- a damaged storage is one line
def _damage(study, where: str, key: str, value) -> None:
    """Set a study attribute (where == "study") or add a trial carrying one of the wrong kind."""
    if where == "study":
        study.set_user_attr(key, value)
    else:
        user = {"config": cfg(2), "median_us": 3.8, "parity": "exact", key: value}
        study.add_trial(optuna.trial.create_trial(value=3.8, user_attrs=user, params={},
                                                  distributions={}))


DAMAGED_STUDY = [("shape", "m=4"), ("shape", [1, 2]), ("calls_per_step", "many"),
                 ("step_us", {"a": 1}), ("hit_rate", "x"), ("hit_rate", -1.0),
                 ("family", 7), ("default_config", [1]), ("phase", ["decode"])]
DAMAGED_TRIAL = [("config", "ROWS_PER_BLOCK=8"), ("config", [1, 2]), ("median_us", "fast"),
                 ("median_us", [4.0]), ("median_us", True)]


@pytest.mark.parametrize("where,key,value", [("study", k, v) for k, v in DAMAGED_STUDY]
                         + [("trial", k, v) for k, v in DAMAGED_TRIAL])
def test_rank_on_damaged_study_attributes_is_one_line(tmp_path, capsys, where, key, value):
    """A study or trial attribute of the wrong kind (a hand-edited or damaged storage) was an
    'internal error' (exit 1: dict('m=4'), float('many')); it is one line naming the study,
    the trial and the attribute, exit 2, and no verdict file."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = make_study(url, "m=4,n=4864,k=896,dtype=bfloat16", 48.0,
                       [(cfg(8), 4.0, "exact", "ok"), (cfg(4), 4.1, "exact", "ok")])
    _damage(study, where, key, value)
    out = tmp_path / "verdicts"
    rc = main(["rank", "--storage", url, "--device", "nvidia-h200", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("tuner: error: "), err
    assert "internal error" not in err and f"user attribute {key} is {value!r}" in err
    assert "study nvidia-h200:gemv:m=4,n=4864,k=896,dtype=bfloat16" in err
    if where == "trial":
        assert "trial 2 of study" in err
    assert not out.exists() or not any(out.iterdir())


def test_rank_keeps_an_unmeasured_time_in_the_study_attributes(tmp_path):
    """baseline_us None (its timing failed) or NaN is no damage: the study is ranked."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = make_study(url, "m=4,n=4864,k=896,dtype=bfloat16", 48.0,
                       [(cfg(8), 4.0, "exact", "ok")])
    study.set_user_attr("baseline_us", None)
    study.set_user_attr("default_us", math.nan)
    studies = rank.load_studies(url, family="gemv")
    assert [c.config for c in studies[0].candidates] == [cfg(8)]


GARBAGE = ["x", None, [], {}, -1.0, True, [1, "a"], {"a": "b"}, float("nan")]
STUDY_ATTRS = ["family", "shape", "shape_key", "device", "backend", "baseline_us", "default_us",
               "calls_per_step", "step_us", "hit_rate", "phase", "default_config"]
TRIAL_ATTRS = ["config", "median_us", "noise_pct", "output_hash", "parity", "failure"]


@pytest.mark.skipif(_gpu_visible(), reason="where the values can be read, a GPU would re-measure")
def test_fuzzed_study_and_trial_attributes_are_one_line(tmp_path, capsys):
    """A seeded sample of the study and trial attributes rank reads, each replaced by a value
    of another kind: every `tuner rank` ends with exactly one `tuner: error:` line and exit 2
    (the damage named, or, where the value can be read, that this machine has no GPU to
    re-measure on), never an internal error."""
    import random

    cases = [("study", k, v) for k in STUDY_ATTRS for v in GARBAGE] + \
            [("trial", k, v) for k in TRIAL_ATTRS for v in GARBAGE]
    named = 0
    for i, (where, key, value) in enumerate(random.Random(32).sample(cases, 40)):
        url = f"sqlite:///{tmp_path / f'studies{i}.db'}"
        study = make_study(url, "m=4,n=4864,k=896,dtype=bfloat16", 48.0,
                           [(cfg(8), 4.0, "exact", "ok")])
        _damage(study, where, key, value)
        rc = main(["rank", "--storage", url, "--device", "nvidia-h200", "-o",
                   str(tmp_path / "verdicts")])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and err.startswith("tuner: error: "), \
            (where, key, value, err)
        assert "internal error" not in err, (where, key, value, err)
        named += f"user attribute {key} is" in err
    assert named >= 10


def test_a_share_bar_against_a_compiled_baseline_of_eager_studies_warns_once(storage, capsys):
    """The studies' step is the traced eager step's: against max-autotune a share-of-the-step bar
    is of that longer step, which rank says once (a time bar, or the eager baseline, says
    nothing)."""
    big, small = "m=4,n=4864,k=896,dtype=bfloat16", "m=4,n=896,k=4864,dtype=bfloat16"
    records = {(key, rows): (lambda c: measured(c, base=4.80, cand_us=4.00, low=1.17, high=1.23))
               for key in (big, small) for rows in (8, 4, 2)}
    measure, _ = recorded_measure(records)
    ident = {"device_name": "NVIDIA H200", "arch": "sm90", "backend": "cuda", "torch": "2.11.0",
             "triton": "3.6.0", "kernel_hash": "0123456789abcdef", "fp_fusion": True}
    options = dict(family="gemv", device="nvidia-h200", measure=measure,
                   identity=lambda family: ident, progress=False)
    rank.rank(storage, baseline="max-autotune", **options)
    err = capsys.readouterr().err
    assert err.count("studies are of an eager trace") == 1
    assert "not of the shorter max-autotune step" in err and "--min-saving 20us" in err
    rank.rank(storage, baseline="max-autotune", threshold="10us", **options)
    rank.rank(storage, baseline="eager", **options)
    assert "eager trace" not in capsys.readouterr().err
