"""How far a kernel could beat torch at all, per case of a log of scripts/gpu/sweep_linears.sh:
the physical floor of each case, max(bytes / read bandwidth, flops / matmul rate), against
torch's measured time. `ceiling` = torch / floor is the speedup a kernel at the floor would get;
`1.10x needs` = the share of the floor's speed a kernel must reach to be 1.10x torch (over 100%:
impossible). Bandwidth: the log's own measurement at the start; matmul rate: a `tuner device`
profile (bf16 8192^3 torch.matmul, the best this GPU showed).
  python3 scripts/kernel_ceilings.py benchmarks/logs/2026-12-01/late/14c_kernels15.log.gz \
      benchmarks/logs/2026-12-01/nvidia-h200.device.json [--min-m 16]
"""
import argparse
import gzip
import json


def results(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith("RESULTS-JSON "):
                return json.loads(line[len("RESULTS-JSON "):])
    raise SystemExit(f"{path}: no RESULTS-JSON line")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log")
    p.add_argument("device_json")
    p.add_argument("--min-m", type=int, default=16)
    args = p.parse_args()
    data = results(args.log)
    bandwidth = float(data["bandwidth"])
    rate = float(json.load(open(args.device_json))["bf16_matmul_flops_per_s"])
    print(f"read bandwidth {bandwidth / 1e12:.3f} TB/s (the log's), bf16 matmul "
          f"{rate / 1e12:.0f} TFLOP/s (the device profile)")
    print("| m | n x k | torch us | floor us (bound) | ceiling | best x | best % of floor | 1.10x needs |")
    print("| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for c in sorted(data["cases"], key=lambda c: (c["m"], c["n"] * c["k"])):
        if c["m"] < args.min_m or not c.get("torch_us"):
            continue
        flops = 2.0 * c["m"] * c["n"] * c["k"]
        mem_us, flop_us = c["bytes"] / bandwidth * 1e6, flops / rate * 1e6
        floor = max(mem_us, flop_us)
        bound = "bytes" if mem_us >= flop_us else "flops"
        torch_us, best_us = c["torch_us"], c["best_us"]
        print(f"| {c['m']} | {c['n']}x{c['k']} | {torch_us:.2f} | {floor:.2f} ({bound}) | "
              f"{torch_us / floor:.3f} | {c['speedup']:.3f} | {100 * floor / best_us:.0f}% | "
              f"{110 * floor / torch_us:.0f}% |")


if __name__ == "__main__":
    main()
