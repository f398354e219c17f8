"""The report's charts, drawn with matplotlib's object API on the Agg canvas (no display, no
pyplot state, nothing global changed) and embedded as base64 PNG.

Each `*_figure` function takes plain data and returns a matplotlib Figure (tests read its lines
and bars); `png(fig)` turns one into the base64 text of a PNG. matplotlib is the optional
``report`` extra: `available()` says whether it can be imported, and the report falls back to
its tables when it cannot.
"""

from __future__ import annotations

import base64
import io
import math

from ..parity import DEFAULT_MARGIN

__all__ = ["COLORS", "ab_saving_figure", "ab_steps_figure", "ab_tokens_figure", "available",
           "budget_figure", "png", "search_figure", "short_config", "step_figure",
           "verdict_figure"]

COLORS = {"keep": "#2e9d4f", "prune": "#aab1bd", "unjudged": "#e3a21a", "line": "#c0392b",
          "accept": "#2e9d4f", "runner-up": "#97d3a6", "reject": "#d9534f", "base": "#4c72b0",
          "default": "#8172b2", "tuned": "#2e9d4f", "aa": "#aab1bd", "baseline": "#4c72b0",
          "projected": "#f0a030", "measured": "#4c72b0", "mismatch": "#f0a030"}
MAX_ROWS = 28  # bars per chart; the tables list every row


def available() -> tuple[bool, str]:
    """(True, '') when matplotlib imports, else (False, why)."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError as exc:
        return False, (f"matplotlib is not installed ({exc}): pip install "
                       f"'kernel-tuner-service[report]' (or matplotlib) for the charts")
    return True, ""


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png(fig) -> str:
    """The figure as base64 PNG text (no metadata)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _ok(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _style(ax) -> None:
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.tick_params(labelsize=8.5)
    ax.grid(axis="x", color="#e3e6eb", linewidth=0.8)
    ax.set_axisbelow(True)


def short_config(config: dict) -> str:
    """{'ROWS_PER_BLOCK': 2, 'BLOCK_K': 256, 'num_warps': 4} -> 'RPB2 BK256 nw4'."""
    parts = []
    for key, value in sorted(config.items()):
        initials = "".join(w[0] for w in str(key).split("_") if w)
        parts.append(f"{initials}{value}")
    return " ".join(parts)


# ----------------------------------------------------------------------------------- budget
def step_figure(phases: list[dict]):
    """Per phase: the step's wall time with its GPU-busy part. phases: [{phase, wall_us,
    gpu_us, basis}], basis 'gpu_busy' or 'wall' (what the budget compared with)."""
    fig = _figure(11, 0.85 + 0.45 * len(phases))
    ax = fig.add_subplot()
    labels = []
    for i, p in enumerate(phases):
        wall, gpu = p["wall_us"] / 1000, p["gpu_us"] / 1000
        ax.barh(i, wall, color="#e3e6eb", edgecolor="#aab1bd", height=0.6,
                label="wall time of a step" if i == 0 else None)
        ax.barh(i, gpu, color=COLORS["base"], height=0.6,
                label="GPU busy" if i == 0 else None)
        busy = gpu / wall if wall > 0 else math.nan
        basis = "GPU-busy step" if p["basis"] == "gpu_busy" else "wall step"
        ax.text(wall, i, f"  {wall:.2f} ms wall, GPU busy {gpu:.2f} ms ({busy:.0%}); "
                f"budget against the {basis}", va="center", fontsize=8.5)
        labels.append(p["phase"])
    ax.set_yticks(range(len(phases)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step", fontsize=9)
    ax.set_xlim(0, max(p["wall_us"] for p in phases) / 1000 * 1.9)
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1), ncol=2, frameon=False)
    _style(ax)
    return fig


def budget_figure(rows: list[dict], *, threshold_us: float | None, safety: float,
                  threshold_text: str, phase: str):
    """Headroom per shape (µs per token) of one phase, best first: the full headroom (light),
    the part the budget counts (× safety, solid: green kept, grey pruned) and the threshold
    line. rows: [{label, headroom, verdict, unjudged}]."""
    shown = rows[:MAX_ROWS]
    fig = _figure(11, 1.3 + 0.27 * len(shown))
    ax = fig.add_subplot()
    top = max([r["headroom"] for r in shown if _ok(r["headroom"])] + [threshold_us or 0, 1e-3])
    for i, r in enumerate(shown):
        kind = "unjudged" if r["unjudged"] else r["verdict"]
        color = COLORS.get(kind, COLORS["prune"])
        full = r["headroom"] if _ok(r["headroom"]) else 0.0
        ax.barh(i, full, color=color, alpha=0.28, height=0.72)
        ax.barh(i, full * safety, color=color, height=0.72)
        text = ("not budgeted (kept)" if r["unjudged"]
                else f"{r['verdict']}  {full:.3g} µs/token")
        ax.text(full + top * 0.01, i, text, va="center", fontsize=8, color="#333")
    _threshold_line(ax, threshold_us, "")
    ax.set_yticks(range(len(shown)), [r["label"] for r in shown], fontsize=8)
    ax.set_ylim(len(shown) - 0.5, -1.3)
    ax.set_xlim(0, top * 1.28)
    ax.set_xlabel("µs per token (per step of the phase)", fontsize=9)
    ax.set_title(f"{phase}: headroom per shape; solid = {safety:g} × headroom, kept when it "
                 f"reaches the line ({threshold_text})", fontsize=9.5, loc="left")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=COLORS["keep"], label="kept"),
                       Patch(color=COLORS["prune"], label="pruned"),
                       Patch(color=COLORS["keep"], alpha=0.28, label="full headroom")],
              fontsize=8, loc="lower right", frameon=False)
    _style(ax)
    return fig


# ----------------------------------------------------------------------------------- search
def _best_so_far(points: list, key: str) -> tuple[list, list]:
    xs, ys, best = [], [], math.inf
    for i, p in enumerate(points, start=1):  # measured trials, in the order they ended
        if p.outcome == "ok" and p.us is not None and p.us < best:
            best = p.us
        if math.isfinite(best):
            xs.append(i if key == "trial" else (p.elapsed_s or 0.0))
            ys.append(best)
    return xs, ys


def search_figure(study):
    """Best-so-far against trials (left) and against time (right) of one study (a
    tuner.report.data.StudyData), every measured trial as a dot, the baseline's and the default
    config's times as lines."""
    fig = _figure(11, 2.9)
    left, right = fig.subplots(1, 2, width_ratios=[1.25, 1])
    points = [p for p in study.trials if p.outcome in ("ok", "mismatch", "failed")]
    outside = len(study.trials) - len(points)  # outside the space, replayed: never measured
    finite = [p.us for p in points if p.us is not None]
    refs = [x for x in (study.baseline_us, study.default_us) if _ok(x)]
    best = study.best()
    low = min(finite + refs) if finite or refs else 1.0
    high = 1.6 * max([best.us if best else low] + refs)
    for ax, key in ((left, "trial"), (right, "time")):
        xs, ys = _best_so_far(points, key)
        if key == "trial":
            for outcome, marker, label in (("ok", "o", "trial (parity ok)"),
                                           ("mismatch", "x", "trial (parity mismatch)")):
                sel = [(i, p.us) for i, p in enumerate(points, start=1)
                       if p.outcome == outcome and p.us is not None and p.us <= high]
                if sel:
                    ax.scatter([s[0] for s in sel], [s[1] for s in sel], s=14, marker=marker,
                               color=COLORS["base"] if outcome == "ok" else COLORS["mismatch"],
                               alpha=0.55, label=label, zorder=2)
            above = sum(1 for p in points if p.us is not None and p.us > high)
            failed = sum(1 for p in points if p.outcome == "failed")
            extra = [f"{above} above the plot" if above else "",
                     f"{failed} failed (no time)" if failed else "",
                     f"{outside} outside the space or replayed (not measured)"
                     if outside else ""]
            if any(extra):
                ax.text(0.99, 0.97, "; ".join(e for e in extra if e), transform=ax.transAxes,
                        ha="right", va="top", fontsize=7.5, color="#666")
        if xs:
            ax.step(xs, ys, where="post", color=COLORS["tuned"], linewidth=2,
                    label="best so far", zorder=3)
        if _ok(study.baseline_us):
            ax.axhline(study.baseline_us, color=COLORS["line"], linestyle="--", linewidth=1.2,
                       label=f"baseline (serving path) {study.baseline_us:.2f} µs")
        if _ok(study.default_us):
            ax.axhline(study.default_us, color=COLORS["default"], linestyle=":", linewidth=1.5,
                       label=f"default config {study.default_us:.2f} µs")
        ax.set_ylim(low * 0.9, high)
        ax.set_xlabel("trials measured" if key == "trial" else "seconds since the first trial",
                      fontsize=8.5)
        ax.set_ylabel("µs per call", fontsize=8.5)
        _style(ax)
        ax.grid(axis="y", color="#e3e6eb", linewidth=0.8)
    handles, labels = left.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=7.5, loc="outside lower center", frameon=False,
                   ncol=len(handles))
    best_text = f"best {best.us:.2f} µs (trial {best.number})" if best else "no feasible trial"
    fig.suptitle(f"{study.shape_key}: {len(points)} trials measured, {best_text}", fontsize=9.5,
                 x=0.01, ha="left")
    return fig


# --------------------------------------------------------------------------------- verdicts
def verdict_figure(rows: list[dict], *, threshold_us: float | None, threshold_text: str):
    """Projected µs per token saved per candidate, by decision. rows: [{label, saving,
    decision, note}] (saving may be negative: the candidate was slower)."""
    shown = rows[:MAX_ROWS]
    fig = _figure(11, 1.2 + 0.3 * len(shown))
    ax = fig.add_subplot()
    values = [r["saving"] for r in shown if _ok(r["saving"])] + [threshold_us or 0.0, 0.0]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    for i, r in enumerate(shown):
        value = r["saving"] if _ok(r["saving"]) else 0.0
        ax.barh(i, value, color=COLORS.get(r["decision"], COLORS["prune"]), height=0.7)
        ax.text(max(value, 0) + span * 0.01, i, r["note"], va="center", fontsize=7.8, color="#333")
    ax.axvline(0, color="#555", linewidth=0.8)
    _threshold_line(ax, threshold_us, f" ({threshold_text})")
    ax.set_yticks(range(len(shown)), [r["label"] for r in shown], fontsize=7.8)
    ax.set_ylim(len(shown) - 0.5, -1.3)
    ax.set_xlim(min(low, 0) - span * 0.05, high + span * 0.75)
    ax.set_xlabel("projected µs saved per token = (baseline − candidate) µs × calls per step "
                  "× hit rate", fontsize=9)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in ("accept", "runner-up", "reject")],
              fontsize=8, loc="lower right", frameon=False)
    _style(ax)
    return fig


# --------------------------------------------------------------------------------------- A/B
ARMS = ("baseline", "tuned", "aa")


def ab_steps_figure(ab: dict):
    """Step time per arm: every timing group as a dot, the median as a bar end and its noise
    band (± spread) shaded; the speedup and the A/A margin in the title."""
    arms = [a for a in ARMS if a in (ab.get("arms") or {})]
    fig = _figure(11, 0.9 + 0.55 * len(arms))
    ax = fig.add_subplot()
    values = [g for a in arms for g in ab["arms"][a]["groups"]]
    lo, hi = min(values), max(values)
    pad = max((hi - lo) * 0.25, hi * 0.002)
    for i, name in enumerate(arms):
        arm = ab["arms"][name]
        med, spread = arm["median_us"], arm["spread_pct"] or 0.0
        band = med * spread / 100
        ax.fill_betweenx([i - 0.3, i + 0.3], med - band, med + band, color=COLORS[name],
                         alpha=0.3)
        groups = arm["groups"]
        offsets = [((j % 5) - 2) * 0.06 for j in range(len(groups))]
        ax.scatter(groups, [i + o for o in offsets], s=12, color=COLORS[name], zorder=3)
        ax.plot([med, med], [i - 0.34, i + 0.34], color="#222", linewidth=2, zorder=4)
        ax.text(hi + pad * 0.15, i, f"  {name}: {med:.1f} µs ±{spread:.2f}% "
                f"({len(groups)} groups)", va="center", fontsize=8.5)
    ax.set_yticks(range(len(arms)), ["A/A (baseline again)" if a == "aa" else a for a in arms],
                  fontsize=8.5)
    ax.set_ylim(len(arms) - 0.5, -0.5)
    ax.set_xlim(lo - pad, hi + pad * 3.2)
    ax.set_xlabel("µs per decode step (CUDA-graph replay; dots: timing groups, bar: median, "
                  "shade: ± spread)", fontsize=9)
    title = (f"speedup {_fmt(ab.get('speedup'), '.4f')}× [{_fmt(ab.get('speedup_low'), '.4f')}, "
             f"{_fmt(ab.get('speedup_high'), '.4f')}]; A/A {_fmt(ab.get('aa_ratio'), '.4f')}× "
             f"(margin ±{_fmt(ab.get('aa_margin'), '.4f')})")
    ax.set_title(title, fontsize=9.5, loc="left")
    _style(ax)
    return fig


def _fmt(x, fmt: str) -> str:
    return format(x, fmt) if _ok(x) else "–"


def ab_saving_figure(ab: dict):
    """Measured against projected saving, per shape (kernel time per step, from the arms'
    profiled replays) and for the whole step."""
    rows = [("whole step", ab.get("saving_us"), ab.get("projected_us"))]
    rows += [(r["shape"], r.get("measured_saving_us"), r.get("projected_saving_us"))
             for r in (ab.get("attribution") or [])]
    rows = rows[:MAX_ROWS]
    fig = _figure(11, 1.1 + 0.42 * len(rows))
    ax = fig.add_subplot()
    values = [v for _, m, p in rows for v in (m, p) if _ok(v)] + [0.0]
    span = (max(values) - min(values)) or 1.0
    for i, (label, measured, projected) in enumerate(rows):
        m = measured if _ok(measured) else 0.0
        ax.barh(i - 0.18, m, height=0.34, color=COLORS["measured"],
                label="measured" if i == 0 else None)
        if _ok(projected):
            ax.barh(i + 0.18, projected, height=0.34, color=COLORS["projected"],
                    label="projected" if i == 0 else None)
        text = f"{_fmt(measured, '.1f')} measured, " + (
            f"{projected:.1f} projected" if _ok(projected)
            else "not projected (no exported config)")
        ax.text(max(m, projected if _ok(projected) else 0, 0) + span * 0.01, i, text,
                va="center", fontsize=8)
    ax.axvline(0, color="#555", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.6)
    ax.set_xlim(min(values) - span * 0.05, max(values) + span * 0.6)
    ax.set_xlabel("µs saved per step (baseline − tuned)", fontsize=9)
    ax.legend(fontsize=8, loc="lower right", frameon=False)
    _style(ax)
    return fig


def ab_tokens_figure(ab: dict):
    """Teacher-forced top-1 agreement with the fp32 reference per arm against the floor the
    tuned arm must keep (baseline − A/A floor), and each arm's worst logits error relative to
    the baseline arm's."""
    outputs = ab.get("outputs") or {}
    tf = outputs.get("teacher_forced") or {}
    arms = [a for a in ARMS if a in tf]
    fig = _figure(11, 2.3)
    left, right = fig.subplots(1, 2)
    agree = [tf[a].get("agreement") for a in arms]
    left.bar(range(len(arms)), [a if _ok(a) else 0 for a in agree],
             color=[COLORS[a] for a in arms], width=0.6)
    for i, a in enumerate(agree):
        left.text(i, (a if _ok(a) else 0) + 0.02, _fmt(a, ".3f"), ha="center", fontsize=8.5)
    floor = outputs.get("agreement_floor")
    base = tf.get("baseline", {}).get("agreement")
    if _ok(floor) and _ok(base):
        left.axhline(base - floor, color=COLORS["line"], linestyle="--", linewidth=1.3,
                     label=f"baseline − A/A floor ({base:.3f} − {floor:.3f})")
        left.legend(fontsize=7.5, loc="lower right", frameon=False)
    left.set_ylim(0, 1.12)
    left.set_xticks(range(len(arms)), arms, fontsize=8.5)
    left.set_title("top-1 agreement with the fp32 reference (teacher-forced)", fontsize=9,
                   loc="left")
    base_err = tf.get("baseline", {}).get("max_error")
    ratios = [(tf[a].get("max_error") / base_err) if _ok(tf[a].get("max_error")) and _ok(base_err)
              and base_err > 0 else math.nan for a in arms]
    right.bar(range(len(arms)), [r if _ok(r) else 0 for r in ratios],
              color=[COLORS[a] for a in arms], width=0.6)
    for i, r in enumerate(ratios):
        right.text(i, (r if _ok(r) else 0) + 0.03, _fmt(r, ".4f"), ha="center", fontsize=8.5)
    right.axhline(DEFAULT_MARGIN, color=COLORS["line"], linestyle="--", linewidth=1.3,
                  label=f"margin {DEFAULT_MARGIN:g}× (the tuned arm must stay below)")
    right.legend(fontsize=7.5, loc="lower right", frameon=False)
    right.set_ylim(0, 1.45)
    right.set_xticks(range(len(arms)), arms, fontsize=8.5)
    right.set_title("worst logits error, relative to the baseline arm's", fontsize=9, loc="left")
    for ax in (left, right):
        _style(ax)
        ax.grid(axis="x", visible=False)
        ax.grid(axis="y", color="#e3e6eb", linewidth=0.8)
    return fig


def _threshold_line(ax, threshold_us, suffix: str) -> None:
    """The dashed saving threshold of a horizontal bar chart, labelled above the first bar."""
    if _ok(threshold_us):
        ax.axvline(threshold_us, color=COLORS["line"], linestyle="--", linewidth=1.3)
        ax.text(threshold_us, -0.9, f" threshold {threshold_us:.3g} µs/token{suffix}",
                color=COLORS["line"], fontsize=8.5, va="bottom")
