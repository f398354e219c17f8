#!/usr/bin/env bash
# tuner search against the exhaustive grid on one GPU (H200: about 6 minutes).
#   PYTHONPATH=$PWD bash scripts/gpu/search_vs_grid.sh        (optuna importable; log: $OUT/search.log)
# Rows it produces in BENCHMARKS.md: "Search: TPE against the grid".
#   1. one real gemv decode shape (qwen2.5-0.5B MLP up-projection at batch 4: m=4, n=4864, k=896,
#      its valid configs): the exhaustive grid, then TPE with a quarter of the grid's trials; TPE's
#      best vs the grid's best, after how many trials TPE got within 2%, trials per minute per GPU
#      (compilation, parity and cold-L2 timing included). TPE is also replayed offline on the
#      grid's measurements with 20 seeds (no GPU time), which separates the sampler from the noise.
#   2. a short multi-shape search of the bundled example through the CLI, then the same command
#      again (resume: nothing lost, nothing redone).
# No step stops the script. SEARCH_OBJECTIVE=module:function replaces the GPU timing (CPU check):
#   SEARCH_OBJECTIVE=test_search:make_fake PYTHONPATH=$PWD:$PWD/tests OUT=/tmp/out bash scripts/gpu/search_vs_grid.sh
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/search.log"
: > "$LOG"
WORK=$(mktemp -d)
export PYTHONUNBUFFERED=1
SHAPES=shapes/examples/qwen25_05b_b4_decode.parquet
GRID_S=${SEARCH_GRID_S:-180}      # wall-time cap of the grid run
TPE_S=${SEARCH_TPE_S:-60}         # wall-time cap of the TPE run
MULTI_S=${SEARCH_MULTI_S:-45}     # --timeout of the multi-shape search
# a fresh Triton cache, so that the grid's trials per minute include every compilation
export TRITON_CACHE_DIR="$WORK/triton-cache"
PROFILE=$(ls -t artifacts/devices/*.json 2>/dev/null | head -n 1)
PROFILE=${PROFILE:-h200}
OBJECTIVE_FLAG=()
if [ -n "${SEARCH_OBJECTIVE:-}" ]; then OBJECTIVE_FLAG=(--objective "$SEARCH_OBJECTIVE" --gpus 0); fi

step() {  # step "title" command...   (runs, logs, never stops the script)
  echo "== $1" | tee -a "$LOG"
  shift
  "$@" 2>&1 | tee -a "$LOG"
  echo "rc=${PIPESTATUS[0]}" | tee -a "$LOG"
}

cat > "$WORK/grid_vs_tpe.py" <<'PY'
"""Grid vs TPE on one gemv shape, through tuner.search's orchestration (one worker per GPU)."""
import json
import math
import os
import statistics
import sys
import time


def measured_trials(url, name):
    import optuna
    from tuner import search

    study = optuna.load_study(study_name=name, storage=search.make_storage(url, None, None))
    return study, [t for t in study.get_trials(deepcopy=False)
                   if t.state.name in ("COMPLETE", "FAIL") and "duplicate_of" not in t.user_attrs]


def trials_to_within(trials, target, pct=2.0):
    """1-based count of measured trials after which the best feasible time is within pct of target."""
    best = math.inf
    for i, t in enumerate(sorted(trials, key=lambda t: t.number), start=1):
        if t.state.name == "COMPLETE" and t.user_attrs.get("parity") in ("exact", "tolerance"):
            best = min(best, t.value)
        if best <= target * (1 + pct / 100):
            return i
    return None


def replay_tpe(plan, table, n_budget, seed, target):
    """TPE (the same sampler settings as tuner search) on the grid's measurements: no GPU."""
    import optuna
    from tuner import search

    study = optuna.create_study(direction="minimize",
                                sampler=search.make_sampler("tpe", seed, plan.n_valid))
    params0 = {k: plan.default_config[k] for k in plan.space.params}
    study.enqueue_trial(params0)
    for params in search.startup_configs(plan, "tpe", seed):  # as tuner search's queue
        study.enqueue_trial(params)
    seen, measured, best, reached, streak, asked = set(), 0, math.inf, None, 0, 0
    rng = __import__("random").Random(seed)
    while measured < min(plan.n_valid, 2 * n_budget) and asked < 6 * n_budget and reached is None:
        asked += 1
        trial = study.ask()
        params = {k: trial.suggest_categorical(k, list(v)) for k, v in plan.space.params.items()}
        config = {**plan.default_config, **params}
        key = search.config_key(config)
        if not plan.space.allows(params, plan.shape):
            search.set_constraints(trial, space=1.0, parity=0.0)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            streak += 1
        elif key in seen or key not in table:
            entry = table.get(key)
            search.set_constraints(trial, space=0.0,
                                    parity=0.0 if entry and entry["feasible"] else 1.0)
            if entry and entry["value"] is not None:
                study.tell(trial, entry["value"])
            else:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            streak += 1
        else:
            seen.add(key)
            measured += 1
            streak = 0
            entry = table[key]
            search.set_constraints(trial, space=0.0, parity=0.0 if entry["feasible"] else 1.0)
            if entry["value"] is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, entry["value"])
                if entry["feasible"]:
                    best = min(best, entry["value"])
            if reached is None and best <= target * 1.02:
                reached = measured
        if streak >= search.MAX_SAMPLER_REPEATS:
            fresh = [k for k in plan.valid_keys if k not in seen]
            if fresh:
                c = json.loads(rng.choice(fresh))
                study.enqueue_trial({k: c[k] for k in plan.space.params})
            streak = 0
    return reached


def main():
    import optuna
    from tuner_kernels.gemv import default_config
    from tuner import search
    from tuner.spaces import space_for

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    work, grid_s, tpe_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    objective = os.environ.get("SEARCH_OBJECTIVE") or None
    gpus = ["0"] if objective else None
    shape = {"m": 4, "n": 4864, "k": 896, "dtype": "bfloat16"}
    key = "m=4,n=4864,k=896,dtype=bfloat16"
    space = space_for("gemv", "cuda")
    # the SM count of an H200 (the worker's default config asks torch; the parent stays off the GPU)
    default = default_config(shape, "cuda", sm_count=int(os.environ.get("SEARCH_SM_COUNT", "132")))
    stamp = time.strftime("%H%M%S")
    url = f"sqlite:///{work}/grid_tpe.db"

    def plan_for(tag):
        return search.make_plan(family="gemv", shape=shape, shape_key=key,
                                device_key=f"script-{tag}-{stamp}", backend="cuda", space=space,
                                default_config=default, weight=1.0, parity_mode="tolerance")

    n_gpus = 1 if objective else max(1, len(search.visible_gpus()))
    grid_plan = plan_for("grid")
    print(f"shape {key}: {grid_plan.n_valid} valid configs of {space.size()}; default {default}")
    t0 = time.time()
    grid = search.run_search([grid_plan], search.SearchSettings(
        storage=url, sampler="grid", timeout_s=grid_s, gpus=gpus, objective=objective,
        progress=False, trial_timeout_s=120))
    grid_wall = time.time() - t0
    print(search.format_summary(grid))
    study, gtrials = measured_trials(url, grid_plan.study_name)
    durations = [(t.datetime_complete - t.datetime_start).total_seconds() for t in gtrials]
    failures = {}
    for t in gtrials:
        if t.state.name == "FAIL":
            reason = str(t.user_attrs.get("failure", "worker lost"))[:90]
            failures[reason] = failures.get(reason, 0) + 1
    print(f"grid: {len(gtrials)} measured trials in {grid_wall:.0f}s wall; "
          f"mean trial {statistics.mean(durations):.2f}s (median {statistics.median(durations):.2f}s)"
          if durations else "grid: no trials")
    for reason, n in sorted(failures.items(), key=lambda x: -x[1]):
        print(f"  failed x{n}: {reason}")
    table = {}
    for t in gtrials:
        k = search.config_key(t.user_attrs["config"])
        ok = t.state.name == "COMPLETE" and t.user_attrs.get("parity") in ("exact", "tolerance")
        table[k] = {"value": t.value if t.state.name == "COMPLETE" else None, "feasible": ok,
                    "noise_pct": t.user_attrs.get("noise_pct"), "config": t.user_attrs["config"]}
    feasible = sorted((v["value"], k) for k, v in table.items() if v["feasible"])
    if not feasible:
        print("grid found no feasible config; stopping here")
        return
    grid_best, grid_best_key = feasible[0]
    print(f"grid best {grid_best:.3f} us {table[grid_best_key]['config']} "
          f"(noise {table[grid_best_key]['noise_pct']}%); default {grid.shapes[0].default_us} us; "
          f"baseline {grid.shapes[0].baseline_us} us")
    print("grid top 5: " + "; ".join(f"{v:.3f} {json.loads(k)}" for v, k in feasible[:5]))
    n_tpe = max(1, math.ceil(len(gtrials) / 4))

    tpe_plan = plan_for("tpe")
    t0 = time.time()
    tpe = search.run_search([tpe_plan], search.SearchSettings(
        storage=url, sampler="tpe", trials=n_tpe, timeout_s=tpe_s, gpus=gpus, objective=objective,
        progress=False, seed=0, trial_timeout_s=120))
    tpe_wall = time.time() - t0
    print(search.format_summary(tpe))
    _, ttrials = measured_trials(url, tpe_plan.study_name)
    tpe_best = tpe.shapes[0].best_us
    tpe_cfg = tpe.shapes[0].best_config
    within = trials_to_within(ttrials, grid_best)
    tpe_cfg_in_grid = table.get(search.config_key(tpe_cfg or {}), {}).get("value")
    print(f"tpe: {len(ttrials)} measured trials in {tpe_wall:.0f}s; best {tpe_best} us {tpe_cfg}; "
          f"that config in the grid run: {tpe_cfg_in_grid} us; within 2% of the grid best after "
          f"{within} trials")

    t0 = time.time()
    reached = [replay_tpe(grid_plan, table, n_tpe, seed, grid_best) for seed in range(20)]
    print(f"(replay took {time.time() - t0:.0f}s)")
    hit = [r for r in reached if r is not None]
    in_quarter = sum(1 for r in hit if r <= n_tpe)
    print(f"tpe replayed on the grid's measurements, 20 seeds: trials to within 2% = {reached}; "
          f"median {statistics.median(hit) if hit else None}; {in_quarter}/20 within {n_tpe} trials")

    result = {
        "shape": key, "valid_configs": grid_plan.n_valid, "grid_trials": len(gtrials),
        "grid_complete": grid.shapes[0].status == "exhausted", "grid_best_us": grid_best,
        "grid_best_config": table[grid_best_key]["config"], "default_us": grid.shapes[0].default_us,
        "baseline_us": grid.shapes[0].baseline_us, "tpe_trials": len(ttrials), "tpe_best_us": tpe_best,
        "tpe_best_config": tpe_cfg, "tpe_config_grid_us": tpe_cfg_in_grid,
        "tpe_trials_to_2pct": within,
        "tpe_gap_pct": (100 * (tpe_best / grid_best - 1)) if tpe_best else None,
        "replay_median_trials_to_2pct": statistics.median(hit) if hit else None,
        "replay_seeds_within_quarter": in_quarter,
        "gpus": n_gpus,
        "trials_per_min_per_gpu": 60 * len(gtrials) / grid_wall / n_gpus if grid_wall else None,
        "mean_trial_s": statistics.mean(durations) if durations else None,
    }
    with open(f"{work}/result.json", "w") as f:
        json.dump(result, f)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
PY

step "environment" python3 -c "import optuna, torch, triton; print('optuna', optuna.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
step "grid vs TPE on m=4,n=4864,k=896 (grid cap ${GRID_S}s, TPE cap ${TPE_S}s)" \
  timeout -s INT -k 30 $((GRID_S + TPE_S + 90)) python3 "$WORK/grid_vs_tpe.py" "$WORK" "$GRID_S" "$TPE_S"
step "multi-shape search of the bundled example (--timeout ${MULTI_S}s, profile $PROFILE)" \
  timeout -s INT -k 30 $((MULTI_S + 75)) python3 -m tuner.cli search "$SHAPES" --family gemv \
  --device "$PROFILE" --min-saving 1us --timeout "${MULTI_S}s" --storage "sqlite:///$WORK/multi.db" \
  --no-progress --trial-timeout 120 "${OBJECTIVE_FLAG[@]}"
step "the same command again (resume: each shape continues from its stored trials)" \
  timeout -s INT -k 30 60 python3 -m tuner.cli search "$SHAPES" --family gemv \
  --device "$PROFILE" --min-saving 1us --timeout 10s --storage "sqlite:///$WORK/multi.db" \
  --no-progress --trial-timeout 60 "${OBJECTIVE_FLAG[@]}"

echo "== results" | tee -a "$LOG"
python3 - "$WORK/result.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as exc:  # noqa: BLE001
    print(f"no grid/TPE result ({exc})"); sys.exit(0)
def f(v, fmt=".3f"):
    return "-" if v is None else format(v, fmt)
rows = [
    ("shape", r["shape"]),
    ("valid configs / grid trials", f"{r['valid_configs']} / {r['grid_trials']}"
     + ("" if r["grid_complete"] else " (grid cut by its time cap)")),
    ("baseline us (torch)", f(r["baseline_us"])),
    ("default config us", f(r["default_us"])),
    ("grid best us", f"{f(r['grid_best_us'])} {r['grid_best_config']}"),
    ("TPE best us (own run)", f"{f(r['tpe_best_us'])} after {r['tpe_trials']} trials "
     f"({f(r['tpe_gap_pct'], '+.2f')}% vs grid)"),
    ("TPE's config, grid's measurement", f(r["tpe_config_grid_us"])),
    ("TPE trials to within 2% (own run)", str(r["tpe_trials_to_2pct"])),
    ("TPE replay, 20 seeds: median trials to 2%", str(r["replay_median_trials_to_2pct"])),
    ("TPE replay: seeds within 2% in 1/4 grid", f"{r['replay_seeds_within_quarter']}/20"),
    (f"trials per minute per GPU (grid, {r['gpus']} GPU)", f(r["trials_per_min_per_gpu"], ".1f")),
    ("mean trial seconds", f(r["mean_trial_s"], ".2f")),
]
for k, v in rows:
    print(f"{k:<44} {v}")
PY
rm -rf "$WORK"
