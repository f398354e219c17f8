"""Which parameters of each search space change the output bytes (the parity class)? On a GPU.

For one shape per family: the default config, then every config that differs from it in one
parameter (each value the space allows), each checked with tuner.parity.Checker (2 input seeds).
A parameter whose every value keeps the default's class keeps the reduction order; one that
changes it belongs in the space's `order_params`. Also: configs that agree with the default on
the declared order_params but leave its class (a wrong declaration), and how many configs are
bitwise equal to the serving path. Prints a table last; JSON to --out.

    PYTHONPATH=$PWD TRITON_INTERPRET=0 python3 scripts/gpu/parity_classes.py --out /tmp/classes.json

Rows it produces in BENCHMARKS.md: "Which parameters change the output bytes".
"""

from __future__ import annotations

import argparse
import json
import random
import time

SHAPES = {
    "gemv": [{"m": 1, "n": 4096, "k": 4096, "dtype": "bfloat16"},
             {"m": 4, "n": 14336, "k": 4096, "dtype": "bfloat16"}],
    "gemm": [{"m": 32, "n": 4096, "k": 4096, "dtype": "bfloat16", "layout": "NT"}],
    "attention": [{"batch": 8, "heads": 32, "kv_heads": 8, "kv_len": 4096, "head_dim": 128,
                   "dtype": "bfloat16"}],
}


def one_param_variants(space, default: dict, shape: dict) -> list[tuple[str, object, dict]]:
    out = []
    for name, values in space.params.items():
        for value in values:
            if default.get(name) == value:
                continue
            config = {**default, name: value}
            params = {k: config[k] for k in space.params if k in config}
            if len(params) == len(space.params) and space.allows(params, shape):
                out.append((name, value, config))
    return out


def main() -> None:
    import torch

    from tuner_kernels import get_family
    from tuner.errors import CandidateFailure
    from tuner.parity import Checker
    from tuner.spaces import space_for

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="parity_classes.json")
    parser.add_argument("--budget-s", type=float, default=25.0, help="seconds per shape")
    parser.add_argument("--random", type=int, default=24, help="random configs per shape")
    args = parser.parse_args()
    report = []
    for family, shapes in SHAPES.items():
        fam = get_family(family)
        space = space_for(family, "cuda")
        for shape in shapes:
            started = time.time()
            default = fam.default_config(shape, "cuda")
            checker = Checker(fam, shape, seeds=2, default_config=default)
            variants = one_param_variants(space, default, shape)
            rng = random.Random(0)
            pool = space.configs(shape)
            for config in rng.sample(pool, min(args.random, len(pool))):
                variants.append(("random", None, {**default, **config}))
            by_param: dict = {}
            wrong = []
            bitwise = 0
            checked = 0
            for name, value, config in variants:
                if time.time() - started > args.budget_s:
                    break
                try:
                    facts = checker.facts(config)
                except CandidateFailure as exc:
                    by_param.setdefault(name, []).append({"value": value, "failed": exc.reason})
                    continue
                checked += 1
                bitwise += facts.bitwise_vs_baseline
                same = facts.bitwise_vs_default
                if name != "random":
                    by_param.setdefault(name, []).append({"value": value, "same_class": same,
                                                          "error_ratio": facts.error_ratio})
                agrees = all(config.get(p) == default.get(p) for p in space.order_params)
                if agrees and not same:
                    wrong.append(config)
            torch.cuda.empty_cache()
            keeps = sorted(p for p, rows in by_param.items() if p != "random"
                           and rows and all(r.get("same_class", True) for r in rows))
            changes = sorted(p for p, rows in by_param.items() if p != "random"
                             and any(r.get("same_class") is False for r in rows))
            report.append({"family": family, "shape": fam.shape_key(shape), "default": default,
                           "checked": checked, "keeps_class": keeps, "changes_class": changes,
                           "declared_order_params": list(space.order_params),
                           "agree_on_order_params_but_leave_class": wrong[:5],
                           "n_wrong": len(wrong), "bitwise_vs_serving_path": bitwise,
                           "by_param": by_param})
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    print(f"{'family':<10} {'shape':<52} {'n':>4} {'=serving':>8} {'wrong':>5}  keeps | changes")
    for r in report:
        print(f"{r['family']:<10} {r['shape']:<52} {r['checked']:>4} "
              f"{r['bitwise_vs_serving_path']:>8} {r['n_wrong']:>5}  {','.join(r['keeps_class'])} | "
              f"{','.join(r['changes_class'])}  (declared: {','.join(r['declared_order_params'])})")


if __name__ == "__main__":
    main()
