"""Which warp-specialised skinny configs hang the GPU (Triton 3.6 deadlocked one in session 19).

    PYTHONPATH=$PWD python3 scripts/gpu/ws_probe.py OUT.json [M ...]   (default M: 64 128 256)

Every WARP_SPEC = 1 config kernels.candidates lists at those m for the 8B and 27B-class decode
shapes (deduplicated by tile, split and balance: the loop bounds are what a shape changes) runs
once on its first shape, in worker processes that report each config before launching it; a
worker silent for HANG_S seconds is killed and its config recorded as hung, and a new worker
resumes after it. Each config that finishes is checked bitwise against its WARP_SPEC = 0 twin.
Writes {"hung": [...], "ok": [...], "differs": [...], "failed": [...]} (configs with their shape).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import os

HANG_S = float(os.environ.get("WS_PROBE_HANG_S", "45"))  # a first compile takes seconds
DEVICE = os.environ.get("WS_PROBE_DEVICE", "cuda")  # cpu (TRITON_INTERPRET=1): a check of this script
WORKERS = 4
SHAPES = [(4096, 4096), (1024, 4096), (6144, 4096), (12288, 4096), (14336, 4096), (4096, 12288),
          (4096, 14336), (24576, 4096), (28672, 4096), (4096, 5376), (2048, 5376), (5376, 4096),
          (8192, 5376), (21504, 5376), (5376, 21504), (43008, 5376)]


def jobs(ms: list[int]) -> list[dict]:
    from kernels import gemm
    from kernels.candidates import candidate_configs
    from tuner.spaces import space_for

    space, seen, out = space_for("gemm", "cuda"), set(), []
    for m in ms:
        for n, k in SHAPES:
            shape = {"m": m, "n": n, "k": k, "dtype": "bfloat16", "layout": "NT"}
            default = gemm.default_config(shape, "cuda", sm_count=132)
            for c in space.known(candidate_configs("gemm", shape, "cuda", 132), shape, default):
                if not int(c.get("WARP_SPEC", 0)):
                    continue
                key = json.dumps([m, c], sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    out.append({"shape": shape, "config": c})
    return out


def worker(path: str) -> None:
    """Run the jobs of `path` in order; print 'START i' before and 'DONE i <result>' after each."""
    import torch

    from kernels import gemm

    for i, job in enumerate(json.load(open(path))):
        print(f"START {i}", flush=True)
        try:
            inputs = gemm.make_inputs(job["shape"], DEVICE, 0)
            out = gemm.launch(inputs, job["config"])
            plain = gemm.launch(inputs, {**job["config"], "WARP_SPEC": 0})
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            result = "ok" if torch.equal(out, plain) else "differs"
        except Exception as exc:  # noqa: BLE001 - a failing config is data
            result = "failed " + str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        print(f"DONE {i} {result}", flush=True)


def drive(all_jobs: list[dict], out_path: str) -> None:
    results = {"hung": [], "ok": [], "differs": [], "failed": []}
    json.dump(results, open(out_path, "w"), indent=1)
    parts = [all_jobs[w::WORKERS] for w in range(WORKERS)]
    state = []  # per part: [next index, process, last progress time, index running]
    for w, part in enumerate(parts):
        state.append({"part": part, "next": 0, "proc": None, "t": 0.0, "running": None, "w": w})

    def start(s):
        rest = s["part"][s["next"]:]
        if not rest:
            s["proc"] = None
            return
        path = f"/tmp/ws_probe_{s['w']}.json"
        json.dump(rest, open(path, "w"))
        s["base"] = s["next"]
        s["proc"] = subprocess.Popen([sys.executable, __file__, "--worker", path],
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        os.set_blocking(s["proc"].stdout.fileno(), False)
        s["t"], s["running"] = time.time(), None

    for s in state:
        start(s)
    t0 = time.time()
    while any(s["proc"] for s in state):
        time.sleep(0.2)
        for s in state:
            p = s["proc"]
            if p is None:
                continue
            while True:
                line = p.stdout.readline()
                if not line:
                    break
                word, index, *rest = line.split(" ", 2)
                i = s["base"] + int(index)
                s["t"] = time.time()
                if word == "START":
                    s["running"] = i
                elif word == "DONE":
                    verdict = rest[0].strip() if rest else "ok"
                    kind = verdict.split(" ")[0]
                    results[kind].append({**s["part"][i], **({"why": verdict} if kind == "failed" else {})})
                    json.dump(results, open(out_path, "w"), indent=1)  # a cut run keeps what it has
                    s["next"], s["running"] = i + 1, None
            if p.poll() is not None and s["running"] is None:
                if s["next"] < len(s["part"]):  # died between jobs: resume
                    start(s)
                else:
                    s["proc"] = None
            elif time.time() - s["t"] > HANG_S or (p.poll() is not None and s["running"] is not None):
                i = s["running"] if s["running"] is not None else s["next"]
                hung = p.poll() is None
                p.kill()
                p.wait()
                job = s["part"][i]
                results["hung" if hung else "failed"].append(
                    {**job, **({} if hung else {"why": f"worker died (rc {p.returncode})"})})
                print(f"[{time.time() - t0:5.0f}s] {'HUNG' if hung else 'DIED'} m={job['shape']['m']} "
                      f"{job['shape']['n']}x{job['shape']['k']} {json.dumps(job['config'], sort_keys=True)}",
                      flush=True)
                json.dump(results, open(out_path, "w"), indent=1)
                s["next"] = i + 1
                start(s)
    json.dump(results, open(out_path, "w"), indent=1)
    print(f"[{time.time() - t0:5.0f}s] ws_probe: {len(all_jobs)} configs: "
          + ", ".join(f"{k} {len(v)}" for k, v in results.items()), flush=True)
    for job in results["hung"]:
        c = job["config"]
        print(f"  hung: m={job['shape']['m']} {job['shape']['n']}x{job['shape']['k']} BLOCK_M {c['BLOCK_M']} "
              f"BLOCK_N {c['BLOCK_N']} BLOCK_K {c['BLOCK_K']} stages {c['num_stages']} split {c['SPLIT_K']} "
              f"balance {c['BALANCE_N']}")
    for job in results["failed"] + results["differs"]:
        print(f"  {job.get('why', 'differs')}: m={job['shape']['m']} {json.dumps(job['config'], sort_keys=True)}")


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        ms = [int(a) for a in sys.argv[2:]] or [64, 128, 256]
        drive(jobs(ms), sys.argv[1])
