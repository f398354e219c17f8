"""The gemm family at prefill sizes against torch (cuBLAS), and an export of what won.

Run by scripts/gpu/prefill_gemm.sh (its header says what it measures); alone:
    PYTHONPATH=$PWD python3 scripts/gpu/prefill_gemm.py --out DIR [--budget-s S] [--m M,M..]
        [--ab-m M] [--all-known] [--smoke]

Per shape (Llama-3.1-8B linears at m = 128 ... 8192, NT, bf16): cold input sets (rotated past
2 x L2, tuner.bench.make_input_sets), torch.matmul, the default config and the configs of
tuner_kernels.candidates for that shape (the persistent-schedule and tail-split ones among them)
plus the default's tile on the persistent schedule (SCHEDULE 1 and 2, TMA 1), each timed with
tuner.bench (columns tiled / persist / tail: the best of SCHEDULE 0, 1-2 and 3)
(CUDA-graph replays, median of group medians; --all-known: every known config of the shape,
not only the first four tiled ones, compiled ahead in a thread pool by tuner.precompile); the
fastest paired against torch
(tuner.bench.compare: speedup with its 95% interval) and judged by tuner.parity (the three
facts); TFLOP/s of both and their share of the measured bf16 matmul rate
(tuner.device.measure_matmul_rate). The paired results go through tuner.rank.decide (the gate,
the speedup floor) and tuner.export into DIR/export/<device>/ (the `tuner ab` of the .sh reads
it). --smoke: CPU, TRITON_INTERPRET=1, tiny shapes, warm caches, no export: the numbers mean
nothing; it checks the code path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
# the unfused linears transformers' Llama runs (q/o and down are above), at the A/B's prompt
# length only (--ab-m): what `tuner ab --phase prefill|mixed --prompt-tokens M` can hit
AB_SHAPES = [("k/v", 1024, 4096), ("gate/up", 14336, 4096)]
AB_M = 2048
# interleaved large / small m, so that a spent budget cuts the least informative cases
M_ORDER = (2048, 128, 8192, 256, 1024, 4096, 512)
SMOKE_SHAPES, SMOKE_M = [("tiny", 40, 72)], (144, 160)


def m_values(text: str) -> tuple[int, ...]:
    """--m: comma-separated positive integers."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"comma-separated positive integers, not {text!r}")
    return values


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for results.json and export/")
    p.add_argument("--budget-s", type=float, default=140.0,
                   help="start no shape after this many seconds (default 140)")
    p.add_argument("--m", type=m_values, default=(), help="comma-separated m values to run, in this order "
                   f"(default {','.join(map(str, M_ORDER))})")
    p.add_argument("--ab-m", type=int, default=AB_M,
                   help=f"the prompt length of the A/B: the unfused k/v and gate/up linears are "
                   f"added at this m when it is among --m (default {AB_M})")
    p.add_argument("--all-known", action="store_true",
                   help="time every known config of a shape, not only the first 4 tiled ones")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    os.makedirs(args.out, exist_ok=True)
    start = time.time()

    import torch
    import triton

    from tuner_kernels import gemm
    from tuner_kernels.candidates import candidate_configs
    from tuner import bench, parity, rank, runtime
    from tuner.spaces import space_for

    def say(*parts):
        print(f"[{time.time() - start:6.1f}s]", *parts, flush=True)

    smoke = args.smoke
    device = "cpu" if smoke else None
    cache = "warm" if smoke else "cold"
    sweep_opts = dict(groups=1, replays=1, min_calls=1) if smoke else dict(groups=5, replays=5)
    paired_opts = dict(groups=2, replays=1, min_calls=1) if smoke else dict(groups=10, replays=5)
    backend = "cuda" if smoke else bench.backend_name()
    sms = 132 if smoke else torch.cuda.get_device_properties(0).multi_processor_count
    space = space_for("gemm", backend)
    device_key = (runtime.current_identity() or {}).get("key", backend)

    rate, rate_note = None, "not measured (smoke)"
    if not smoke:
        props = torch.cuda.get_device_properties(0)
        say(f"device {props.name}  SMs {sms}  torch {torch.__version__}  triton {triton.__version__}")
        try:
            from tuner.device import measure_matmul_rate

            measured = measure_matmul_rate(8192)
            rate, rate_note = measured["flops_per_s"], measured["method"]
            say(f"measured bf16 matmul rate {rate / 1e12:.0f} TFLOP/s ({rate_note})")
        except Exception as exc:  # noqa: BLE001 - the table then shows no share
            rate_note = f"failed: {exc}"
            say(f"matmul rate measurement failed: {exc}")

    def short(config: dict) -> str:
        keys = {"BLOCK_M": "M", "BLOCK_N": "N", "BLOCK_K": "K", "GROUP_M": "G", "SPLIT_K": "sk",
                "REDUCE_LAST": "last", "SWAP_AB": "swap", "BALANCE_N": "bal", "SCHEDULE": "sch",
                "TMA": "tma", "num_warps": "w", "num_stages": "s"}
        return ",".join(f"{keys[k]}{v}" for k, v in config.items() if k in keys)

    def configs_for(shape: dict) -> list[dict]:
        default = gemm.default_config(shape, backend, sm_count=sms)
        known = space.known(candidate_configs("gemm", shape, backend, sms), shape, default)
        persistent = [c for c in known if c.get("SCHEDULE")]  # 1 / 2, and the tail split (3)
        tiled = [c for c in known if not c.get("SCHEDULE")]
        if not args.all_known:
            tiled = tiled[:4]
        own_tile = [{**default, "SPLIT_K": 1, "SCHEDULE": s, "TMA": 1} for s in (1, 2)]
        if smoke:  # interpreter: tiny tiles, the persistent path with and without descriptors
            tile = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 1, "SPLIT_K": 1,
                    "SWAP_AB": 0, "BALANCE_N": 0, "num_warps": 4, "num_stages": 2}
            own_tile = [{**tile, "SCHEDULE": s, "TMA": t} for s in (1, 2) for t in (0, 1)]
            persistent, tiled = [], []
        extra = space.known(own_tile + persistent, shape, default)
        out = [default]
        for c in extra + tiled:
            if c not in out:
                out.append(c)
        return out

    def reason(exc: Exception) -> str:
        text = str(exc).strip()
        return f"{type(exc).__name__}: {text.splitlines()[0][:160] if text else ''}"

    m_order = args.m or M_ORDER
    cases = [(name, m, n, k) for m in (SMOKE_M if smoke else m_order)
             for name, n, k in (SMOKE_SHAPES if smoke else SHAPES)]
    if not smoke and args.ab_m in m_order:
        at = m_order.index(args.ab_m) * len(SHAPES) + len(SHAPES)
        cases[at:at] = [(name, args.ab_m, n, k) for name, n, k in AB_SHAPES]
    if args.all_known and not smoke:  # compile every case's configs ahead, in parallel
        from tuner.precompile import precompile

        shapes = [{"m": m, "n": n, "k": k, "dtype": "bfloat16", "layout": "NT"} for _, m, n, k in cases]
        jobs = [(gemm.FAMILY, shape, c) for shape in shapes for c in configs_for(shape)]
        report = precompile(jobs, backend, deadline=start + args.budget_s / 2)
        say(f"precompiled {report.compiled} kernels of {report.jobs} configs in {report.seconds:.0f}s "
            f"({len(report.failures)} failed, {report.skipped} skipped)")
    rows, studies = [], []

    def save(exported: str = "") -> None:  # after every case: a killed run keeps what it measured
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"matmul_rate": rate, "matmul_rate_method": rate_note, "rows": rows,
                       "export": exported}, f, indent=1, default=str)

    for name, m, n, k in cases:
        if time.time() - start > args.budget_s:
            say(f"budget spent: skipping m={m} {name}")
            continue
        shape = {"m": m, "n": n, "k": k, "dtype": "bfloat16", "layout": "NT"}
        say(f"-- {name} {gemm.shape_key(shape)}")
        try:
            sets = bench.make_input_sets(gemm.FAMILY, shape, cache, device)
            base = bench.time_config(gemm.FAMILY, shape, "baseline", cache=cache, device=device,
                                     input_sets=sets, **sweep_opts)
            say(f"   torch.matmul {base.median_us:10.2f} us")
            timed, configs = [], configs_for(shape)
            for config in configs:
                try:
                    t = bench.time_config(gemm.FAMILY, shape, config, cache=cache, device=device,
                                          input_sets=sets, **sweep_opts)
                except Exception as exc:  # noqa: BLE001 - a failing config is data
                    say(f"   {short(config):58} FAILED {reason(exc)}")
                    continue
                timed.append((config, t.median_us))
                say(f"   {short(config):58} {t.median_us:10.2f} us")
            if not timed:
                continue
            timed.sort(key=lambda item: item[1])
            best = timed[0][0]
            paired = bench.compare(gemm.FAMILY, shape, best, "baseline", cache=cache,
                                   device=device, input_sets=sets, **paired_opts)
            facts = parity.Checker(gemm.FAMILY, shape, device=device, seeds=1).facts(best)
            flops = gemm.flops(shape)
            tiled_us = min((us for c, us in timed if not c.get("SCHEDULE")), default=None)
            persistent_us = min((us for c, us in timed if c.get("SCHEDULE") in (1, 2)), default=None)
            tail_us = min((us for c, us in timed if c.get("SCHEDULE") == 3), default=None)
            # the tile orders of the tiled schedule: row order (GROUP_M 1) against m-fastest
            row_order = [(c, us) for c, us in timed if not c.get("SCHEDULE") and c.get("GROUP_M", 1) == 1]
            col_order = [(c, us) for c, us in timed if not c.get("SCHEDULE") and c.get("GROUP_M", 1) > 1]
            row = {"weight": name, "m": m, "n": n, "k": k, "best": short(best), "config": best,
                   "ours_us": paired.candidate_us, "torch_us": paired.reference_us,
                   "ours_tflops": flops / paired.candidate_us / 1e6,
                   "torch_tflops": flops / paired.reference_us / 1e6,
                   "ours_pct_rate": 100 * flops / (paired.candidate_us * 1e-6) / rate if rate else None,
                   "torch_pct_rate": 100 * flops / (paired.reference_us * 1e-6) / rate if rate else None,
                   "speedup": paired.speedup, "low": paired.speedup_low, "high": paired.speedup_high,
                   "noise_pct": paired.noise_pct, "default_us": timed_us(timed, configs[0]),
                   "best_tiled_us": tiled_us, "best_persistent_us": persistent_us,
                   "best_tail_split_us": tail_us,
                   "best_row_order": short(row_order[0][0]) if row_order else None,
                   "best_row_order_us": row_order[0][1] if row_order else None,
                   "best_col_order": short(col_order[0][0]) if col_order else None,
                   "best_col_order_us": col_order[0][1] if col_order else None,
                   "timed": [(short(c), us) for c, us in timed],
                   "parity": facts.describe(), "bitwise_vs_baseline": facts.bitwise_vs_baseline,
                   "error_ratio": facts.error_ratio}
            rows.append(row)
            say(f"   best {row['best']}: {row['ours_us']:.2f} us ({row['ours_tflops']:.0f} TFLOP/s) vs "
                f"torch {row['torch_us']:.2f} us ({row['torch_tflops']:.0f} TFLOP/s): speedup "
                f"{row['speedup']:.3f} [{row['low']:.3f}, {row['high']:.3f}]; {facts.describe()}")
            study = rank.StudyInfo(name=f"prefill-gemm:{gemm.shape_key(shape)}", family="gemm",
                                   shape=shape, shape_key=gemm.shape_key(shape), device=device_key,
                                   calls_per_step=32.0, step_us=32.0 * 7 * paired.reference_us,
                                   phase="prefill", backend=backend,
                                   baseline_us=paired.reference_us)
            measured = rank.Measured(config=best, parity=facts,
                                     vs_baseline=rank.Pair(paired.reference_us, paired.candidate_us,
                                                           paired.speedup, paired.speedup_low,
                                                           paired.speedup_high, paired.noise_pct),
                                     baseline_path=bench.baseline_path(gemm.FAMILY, shape))
            studies.append((study, [(rank.Candidate(best, timed[0][1], 0), measured)]))
            del sets
            save()
        except Exception:  # noqa: BLE001 - one shape's failure never loses the others
            say("   FAILED\n" + traceback.format_exc(limit=4))
        if not smoke:
            torch.cuda.empty_cache()

    exported = ""
    if studies:
        # every candidate faster beyond its interval (rank's speedup floor) and within the
        # parity gate is exported: the A/B of the .sh then measures what it does to the step
        table = rank.decide(studies, threshold="0.1us")
        for _, r in table.iterrows():
            say(f"rank {r['shape']}: {r['decision']} ({r['reason']})")
        if not smoke:
            try:
                from tuner import export

                for column, value in rank.identity_columns("gemm").items():
                    table[column] = value
                table["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
                paths = export.export(table, out_root=os.path.join(args.out, "export"))
                exported = ", ".join(str(p) for p in paths)
                say(f"export: {exported}")
            except Exception:  # noqa: BLE001 - the table below still prints
                say("export FAILED\n" + traceback.format_exc(limit=4))
    save(exported)

    print(f"\n== gemm vs torch.matmul (NT, bf16, {cache} caches); measured matmul rate "
          f"{rate / 1e12 if rate else float('nan'):.0f} TFLOP/s  [{time.time() - start:.0f}s]")
    print(f"{'weight':8} {'m':>5} {'n':>6} {'k':>6} {'torch us':>9} {'TF/s':>5} {'%rate':>5} "
          f"{'ours us':>9} {'TF/s':>5} {'%rate':>5} {'speedup [95%]':>22} {'tiled':>8} {'persist':>8} {'tail':>8} "
          f"{'=bytes':>6} {'err x':>6}  best")
    for r in sorted(rows, key=lambda r: (r["m"], r["n"], r["k"])):
        def pct(x):
            return f"{x:5.0f}" if x is not None else "    -"

        def us(x):
            return f"{x:8.1f}" if x is not None else "       -"
        print(f"{r['weight']:8} {r['m']:5} {r['n']:6} {r['k']:6} {r['torch_us']:9.1f} "
              f"{r['torch_tflops']:5.0f} {pct(r['torch_pct_rate'])} {r['ours_us']:9.1f} "
              f"{r['ours_tflops']:5.0f} {pct(r['ours_pct_rate'])} {r['speedup']:6.3f} "
              f"[{r['low']:.3f}, {r['high']:.3f}] {us(r['best_tiled_us'])} "
              f"{us(r['best_persistent_us'])} {us(r.get('best_tail_split_us'))} {'yes' if r['bitwise_vs_baseline'] else 'no':>6} "
              f"{r['error_ratio']:6.2f}  {r['best']}")
    print("\n== tile order of the tiled schedule: row order (GROUP_M 1) against m-fastest (GROUP_M > 1)")
    print(f"{'weight':8} {'m':>5} {'n':>6} {'k':>6} {'torch us':>9} {'row us':>8} {'m-fast us':>9} "
          f"{'row/mf':>6}  best row order | best m-fastest")
    for r in sorted(rows, key=lambda r: (r["m"], r["n"], r["k"])):
        a, b = r["best_row_order_us"], r["best_col_order_us"]
        ratio = f"{a / b:6.3f}" if a and b else "     -"
        print(f"{r['weight']:8} {r['m']:5} {r['n']:6} {r['k']:6} {r['torch_us']:9.1f} "
              f"{a if a is not None else float('nan'):8.1f} {b if b is not None else float('nan'):9.1f} "
              f"{ratio}  {r['best_row_order'] or '-'} | {r['best_col_order'] or '-'}")
    return 0


def timed_us(timed: list, config: dict):
    return next((us for c, us in timed if c == config), None)


if __name__ == "__main__":
    sys.exit(main())
