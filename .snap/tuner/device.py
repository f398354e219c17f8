"""Device detection and measurement: the DeviceProfile contract (DESIGN.md).

A DeviceProfile is saved as JSON under artifacts/devices/<name>.json. Measured profiles come from
`tuner device` on the GPU; `SPEC_PROFILES` holds published datasheet peaks, labelled as such,
for screening on a machine without the GPU.

The third floor of the measuring core (docs/interfaces.md): the profile's measurement stands on
the detection (tuner.hardware: `detect`, `is_hip`, `versions`, `DCU_ARCHS`, re-exported here),
the timer (tuner.timing), the read-only kernels (tuner.readers: `stream_read_kernel`, re-exported)
and the read curve (tuner.ceilings); none of them imports this module.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import ceilings
from .errors import TunerError
from .hardware import DCU_ARCHS, detect, detect_fields, is_hip, require_gpu, versions
from .readers import stream_read_kernel
from .timing import median, time_events
from .units import parse_bandwidth, parse_matmul_rate

__all__ = ["DCU_ARCHS", "DEVICES_DIR", "DeviceProfile", "choose_profile", "describe", "detect",
           "detect_fields", "find_saved_profile", "is_hip", "load_profile", "measure",
           "measure_kernel_floor", "measure_matmul_rate", "measure_read_bandwidth", "profile_key",
           "save_profile", "spec_key_for", "spec_names", "stream_read_kernel", "versions"]

DEVICES_DIR = Path("artifacts") / "devices"

@dataclass
class DeviceProfile:
    backend: str  # "cuda" or "hip"
    vendor: str  # "nvidia", "amd", "hygon"
    name: str  # e.g. "NVIDIA H200"
    arch: str  # "sm90", "gfx942", "gfx936"
    warp_size: int
    multiprocessors: int
    l2_bytes: int
    read_bandwidth_bytes_per_s: float  # measured (or spec) read bandwidth
    bf16_matmul_flops_per_s: float  # measured (or spec) dense bf16 matmul rate
    source: str = "measured"  # "measured" or "spec"
    versions: dict = field(default_factory=dict)  # torch, triton, cuda/hip, driver
    measured_at: str = ""  # ISO time, empty for spec profiles
    is_dcu: bool = False
    notes: dict = field(default_factory=dict)  # how the numbers were measured (method, sizes)
    # The fixed cost of one kernel inside a CUDA/HIP graph (launch, the smallest execution and
    # the gap to the next kernel): no call of a kernel can take less. 0: not measured.
    kernel_floor_us: float = 0.0
    # The read latency: the fixed cost of one kernel that reads from device memory (launch in a
    # graph, first bytes from HBM, ramp and tail), from the read curve (tuner.ceilings): no
    # measured reader read N bytes in less than read_latency_us + N / read bandwidth. 0: not
    # measured (profiles written before it, spec profiles).
    read_latency_us: float = 0.0

    @property
    def key(self) -> str:
        """File-system friendly name, e.g. 'nvidia-h200'."""
        return profile_key(self.name)

    @property
    def device_key(self) -> str:
        """The key without the '-spec' tag: studies and exports name the device, not the datasheet."""
        return re.sub(r"-spec$", "", self.key)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "DeviceProfile":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise TunerError(f"device profile has unknown fields: {', '.join(sorted(unknown))}")
        return cls(**data)


# Published datasheet peaks (dense, no sparsity). Labelled source="spec": leads, not measurements.
SPEC_PROFILES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile("cuda", "nvidia", "NVIDIA H100 80GB HBM3 (spec)", "sm90", 32, 132,
                          50 * 2**20, 3.35e12, 989e12, source="spec"),
    "h200": DeviceProfile("cuda", "nvidia", "NVIDIA H200 (spec)", "sm90", 32, 132,
                          60 * 2**20, 4.8e12, 989e12, source="spec"),
    "a100": DeviceProfile("cuda", "nvidia", "NVIDIA A100-SXM4-80GB (spec)", "sm80", 32, 108,
                          40 * 2**20, 2.039e12, 312e12, source="spec"),
    "mi300x": DeviceProfile("hip", "amd", "AMD Instinct MI300X (spec)", "gfx942", 64, 304,
                            4 * 2**20, 5.3e12, 1307e12, source="spec"),
}


def save_profile(profile: DeviceProfile, directory: str | Path = DEVICES_DIR) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{profile.key}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(profile.to_json() + "\n")
    tmp.replace(path)
    return path


def load_profile(name_or_path: str | Path, directory: str | Path = DEVICES_DIR) -> DeviceProfile:
    """Load a profile from a JSON path, a saved profile key, or a spec name (h100, h200, mi300x)."""
    text = str(name_or_path)
    path = Path(text)
    if not path.exists():
        candidate = Path(directory) / f"{text}.json"
        if candidate.exists():
            path = candidate
        elif text.lower() in SPEC_PROFILES:
            return dataclasses.replace(SPEC_PROFILES[text.lower()])
        elif any(p.device_key == text.lower() for p in SPEC_PROFILES.values()):
            # a device key as studies and exports name it ('nvidia-h200'): its spec profile
            return dataclasses.replace(next(p for p in SPEC_PROFILES.values()
                                            if p.device_key == text.lower()))
        else:
            known = spec_names()
            raise TunerError(
                f"unknown device profile {text!r}: give a JSON file from `tuner device`, "
                f"a saved profile under {directory}, or a spec name ({known})")
    try:
        return DeviceProfile.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as exc:
        raise TunerError(f"cannot read device profile {path}: {exc}") from None


def spec_key_for(device_name: str) -> str | None:
    """The spec profile whose name matches a trace's device name ('NVIDIA H200' -> 'h200')."""
    words = set(re.findall(r"[a-z0-9]+", str(device_name).lower()))
    for key in sorted(SPEC_PROFILES, key=len, reverse=True):
        if key in words:
            return key
    return None


def spec_names() -> str:
    """'a100, h100, h200, mi300x': the spec profile names, for help texts and errors."""
    return ", ".join(sorted(SPEC_PROFILES))


def profile_key(name: str) -> str:
    """The file-system key a profile of this device name is saved under ('nvidia-h200')."""
    return re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")


def choose_profile(device: str | Path | None = None, trace_devices=(), *, gpu: bool = False,
                   bandwidth: str | None = None, matmul_rate: str | None = None,
                   directory: str | Path | None = None) -> tuple[DeviceProfile, str]:
    """The DeviceProfile a stage budgets with, and a label that says where it came from.

    One order for every command (budget, search, run, rank):
    1. `device` (--device): a profile JSON from `tuner device`, a saved profile key or a spec name;
    2. with `gpu` (the search runs here): the measured profile saved for this machine's GPU;
    3. a measured profile saved under artifacts/devices for one of `trace_devices` (the shape
       table's or trace's device names);
    4. the spec profile matching one of those names (published peaks, labelled as not measured);
    5. `bandwidth` and `matmul_rate` together (a custom profile);
    else a TunerError that says what to give. `bandwidth` / `matmul_rate` (e.g. '4.8TB/s',
    '989TFLOPs') override the chosen profile's rates.
    """
    directory = Path(directory) if directory is not None else DEVICES_DIR
    bandwidth_bps = parse_bandwidth(bandwidth) if bandwidth else None
    rate = parse_matmul_rate(matmul_rate) if matmul_rate else None
    names = [str(n) for n in trace_devices
             if n is not None and str(n).strip().lower() not in ("", "nan", "none", "unknown", "cpu")]
    profile, label = None, ""
    if device:
        profile = load_profile(device, directory)
        what = ("published datasheet peaks, not measured" if profile.source == "spec"
                else f"{profile.source} {profile.measured_at}".strip())
        label = f"{profile.name}: {what} (from --device {device})"
    else:
        if gpu:
            try:
                names.insert(0, detect()["name"])
            except TunerError:
                pass
        for name in names:
            path = directory / f"{profile_key(name)}.json"
            if path.exists():
                profile = load_profile(path)
                label = (f"{profile.name} (measured profile {path}, measured "
                         f"{profile.measured_at or 'at an unknown time'}, for the device {name!r})")
                break
        if profile is None:
            for name in names:
                key = spec_key_for(name)
                if key:
                    profile = load_profile(key, directory)
                    label = (f"{profile.name}: published datasheet peaks for the device {name!r}, "
                             f"not measured (run `tuner device` on it for a measured profile, or "
                             f"give --device)")
                    break
    if profile is None:
        if bandwidth_bps is None or rate is None:
            seen = ", ".join(repr(n) for n in names) or "none recorded"
            raise TunerError(f"no device profile (device: {seen}): give --device with a profile "
                             f"JSON from `tuner device`, a saved profile name or a spec name "
                             f"({spec_names()}); or both --bandwidth and --matmul-rate")
        custom = DeviceProfile("", "", "custom", "", 0, 0, 0, bandwidth_bps, rate, source="given")
        return custom, "rates given on the command line (--bandwidth and --matmul-rate)"
    if bandwidth_bps is not None or rate is not None:
        profile = dataclasses.replace(
            profile, source=f"{profile.source}, overridden",
            read_bandwidth_bytes_per_s=bandwidth_bps or profile.read_bandwidth_bytes_per_s,
            bf16_matmul_flops_per_s=rate or profile.bf16_matmul_flops_per_s)
        label += "; rates given on the command line replace its own"
    return profile, label


# ------------------------------------------------------------------------------------ measurement
def _require_gpu():
    """torch, when it sees a GPU; else a NoGPUError that names the spec profiles."""
    return require_gpu(f"use a spec profile ({spec_names()}) to screen without one")


def measure_read_bandwidth(buffer_bytes: int = 4 << 30, repeats: int = 20) -> dict:
    """Read bandwidth in bytes/s: a read-only streaming Triton sum over a buffer far above L2
    (one fp32 partial per program, wide loads), and torch's sum over the same buffer as a
    cross-check. The profile takes the better of the two; both are reported."""
    torch = _require_gpu()
    free, _total = torch.cuda.mem_get_info()
    buffer_bytes = int(min(buffer_bytes, free // 3))
    block, steps = 4096, 8  # int32 elements per load step, steps per program
    per_program = block * steps
    elements = max(per_program, (buffer_bytes // 4) // per_program * per_program)
    buf = torch.empty(elements, dtype=torch.int32, device="cuda").random_(-1000, 1000)
    programs = elements // per_program
    partial = torch.empty(programs, dtype=torch.int32, device="cuda")
    kernel = stream_read_kernel()

    def triton_read():
        kernel[(programs,)](buf, partial, BLOCK=block, STEPS=steps, num_warps=8)

    def torch_read():
        buf.sum(dtype=torch.int64)

    nbytes = buf.numel() * buf.element_size()
    triton_s = median(time_events(triton_read, repeats)) * 1e-6
    torch_s = median(time_events(torch_read, repeats)) * 1e-6
    del buf, partial
    torch.cuda.empty_cache()
    triton_bw, torch_bw = nbytes / triton_s, nbytes / torch_s
    return {"bytes_per_s": max(triton_bw, torch_bw), "buffer_bytes": nbytes,
            "triton_stream_bytes_per_s": triton_bw, "torch_sum_bytes_per_s": torch_bw,
            "method": "median of %d event-timed full reads" % repeats}


def measure_matmul_rate(size: int = 8192, repeats: int = 20) -> dict:
    """Dense bf16 matmul rate (flop/s) of torch.matmul on random size x size x size operands."""
    torch = _require_gpu()
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)

    def run():
        torch.matmul(a, b, out=c)

    for _ in range(3):
        run()
    seconds = median(time_events(run, repeats)) * 1e-6
    del a, b, c
    torch.cuda.empty_cache()
    return {"flops_per_s": 2.0 * size**3 / seconds, "size": size,
            "method": "median of %d event-timed torch.matmul bf16 %d^3" % (repeats, size)}


def measure_kernel_floor(kernels: int = 400, repeats: int = 20) -> dict:
    """µs per kernel of a CUDA/HIP graph of `kernels` back-to-back one-element Triton kernels:
    what one kernel costs inside a graph when it does (almost) nothing."""
    import triton
    import triton.language as tl

    torch = _require_gpu()

    @triton.jit
    def touch(ptr):
        tl.store(ptr + tl.program_id(0), 1.0)

    buf = torch.zeros(1, device="cuda", dtype=torch.float32)
    touch[(1,)](buf)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            touch[(1,)](buf)
    per_kernel = median(time_events(graph.replay, repeats, warmup=2)) / kernels
    return {"us": per_kernel, "kernels": kernels,
            "method": f"median of {repeats} event-timed replays of a graph of {kernels} "
                      "one-element Triton kernels"}


def measure(device: int | None = None, buffer_bytes: int = 4 << 30,
            matmul_size: int = 8192, progress=None) -> DeviceProfile:
    """Detect the visible GPU and measure its read bandwidth, read curve (the read latency),
    bf16 matmul rate and kernel floor; `progress(text)` hears of each step."""
    import datetime

    torch = _require_gpu()
    if device is not None:
        torch.cuda.set_device(int(device))
    fields = detect(device)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    say = progress or (lambda text: None)
    say(f"read bandwidth: streaming {buffer_bytes / 2**30:.1f} GiB")
    bandwidth = measure_read_bandwidth(buffer_bytes)
    curve = ceilings.measure_read_curve(progress=lambda p: say(
        f"read curve: {p['bytes'] / 2**10:.0f} KiB in {p['us']:.2f} us ({p['reader']})"))
    # the read bandwidth: the curve's slope (graph replays, the kernels' own protocol), or the
    # event-timed stream where that is higher (tuner.ceilings says why the slope comes first)
    slope_bw, intercept = ceilings.slope(curve["points"])
    curve.update(slope_bytes_per_s=slope_bw, intercept_us=intercept)
    read_bw, bandwidth["from"] = ceilings.choose_bandwidth(bandwidth["bytes_per_s"],
                                                           curve["points"])
    bandwidth["bytes_per_s"] = read_bw
    latency = ceilings.fit(curve["points"], read_bw)
    curve["latency_us"] = latency
    say(f"bf16 matmul rate: {matmul_size}^3")
    matmul = measure_matmul_rate(matmul_size)
    floor = measure_kernel_floor()
    info = versions()
    info["gcn_arch_name"] = str(getattr(props, "gcnArchName", "") or "")
    info["total_memory"] = int(getattr(props, "total_memory", 0) or 0)
    return DeviceProfile(
        **fields,
        read_bandwidth_bytes_per_s=bandwidth["bytes_per_s"],
        bf16_matmul_flops_per_s=matmul["flops_per_s"],
        source="measured",
        versions=info,
        measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        notes={"read_bandwidth": bandwidth, "read_curve": curve, "matmul": matmul,
               "kernel_floor": floor},
        kernel_floor_us=floor["us"],
        read_latency_us=latency,
    )


def find_saved_profile(directory: str | Path = DEVICES_DIR) -> DeviceProfile | None:
    """The measured profile saved for the visible GPU, or None (no GPU, or none saved)."""
    try:
        fields = detect()
    except TunerError:
        return None
    path = Path(directory) / f"{profile_key(fields['name'])}.json"
    return load_profile(path) if path.exists() else None


def describe(profile: DeviceProfile) -> str:
    """A short human-readable block for the CLI."""
    lines = [
        f"device     {profile.name}  ({profile.backend}, {profile.vendor}, {profile.arch}"
        f"{', DCU' if profile.is_dcu else ''})",
        f"layout     {profile.multiprocessors} multiprocessors, warp {profile.warp_size}, "
        f"L2 {profile.l2_bytes / 2**20:.1f} MiB",
        f"bandwidth  {profile.read_bandwidth_bytes_per_s / 1e12:.3f} TB/s read ({profile.source})",
        f"matmul     {profile.bf16_matmul_flops_per_s / 1e12:.1f} TFLOP/s bf16 ({profile.source})",
        f"kernel     {profile.kernel_floor_us:.2f} us per kernel inside a graph ({profile.source})"
        if profile.kernel_floor_us else "kernel     floor per kernel not measured",
        f"latency    {profile.read_latency_us:.2f} us a read kernel: no measured kernel read N bytes "
        f"in under {profile.read_latency_us:.2f} us + N / bandwidth"
        if profile.read_latency_us else "latency    read latency not measured (the floor is bytes / "
        "bandwidth)",
    ]
    points = ((profile.notes or {}).get("read_curve") or {}).get("points") or []
    if points and profile.read_bandwidth_bytes_per_s:
        bw = profile.read_bandwidth_bytes_per_s
        lines.append("read curve " + ", ".join(
            (f"{p['bytes'] / 2**20:.0f} MiB" if p["bytes"] >= 2**20 else f"{p['bytes'] / 2**10:.0f} KiB")
            + f" {p['us']:.1f} us ({100 * p['bytes'] / (p['us'] * 1e-6) / bw:.0f}%)"
            for p in points if isinstance(p.get("us"), (int, float)) and math.isfinite(p["us"])))
    rb = (profile.notes or {}).get("read_bandwidth") or {}
    curve = (profile.notes or {}).get("read_curve") or {}
    if {"triton_stream_bytes_per_s", "torch_sum_bytes_per_s", "buffer_bytes"} <= set(rb):
        slope = curve.get("slope_bytes_per_s")
        lines.append(f"           from the {rb.get('from', 'event-timed stream')}: triton stream "
                     f"{rb['triton_stream_bytes_per_s'] / 1e12:.3f} TB/s, torch sum "
                     f"{rb['torch_sum_bytes_per_s'] / 1e12:.3f} TB/s over "
                     f"{rb['buffer_bytes'] / 2**30:.2f} GiB"
                     + (f"; read curve slope {slope / 1e12:.3f} TB/s"
                        if isinstance(slope, float) and math.isfinite(slope) else ""))
    if profile.versions:
        shown = {k: v for k, v in profile.versions.items() if k in ("torch", "triton", "cuda", "hip")
                 and v}
        lines.append("versions   " + ", ".join(f"{k} {v}" for k, v in shown.items()))
    if profile.measured_at:
        lines.append(f"measured   {profile.measured_at}")
    return "\n".join(lines)
