"""Step runs (``moebench step``) as one chart: each composed step as a stacked bar of its parts, per path and point.

A panel per model, dtype and phase (prefill: the TTFT; decode: the time per token); a bar per path at each point,
stacked by part: the part's time x how many of it the step runs (``report.compose``'s terms, the modelled
all-reduces among them), so a bar is as tall as the step's time in the ttft and decode tables. A step lacking a
part (failed its check, refused) has no time and no bar; the caption counts them.
"""

from __future__ import annotations

import math
import textwrap

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from moebench.report import compose
from moebench.report.runs import Runs
from moebench.report.steps import check_disjoint, records

PART_COLORS = {"attention": "tab:blue", "router": "tab:orange", "moe": "tab:red", "shared": "tab:purple",
               "dense_mlp": "tab:green", "head": "tab:brown", "allreduce": "tab:gray"}
PANEL_W, PANEL_H, MAX_COLS = 5.5, 3.6, 2
CAPTION_PT = 7.5
_PHASES = {"prefill": ("prefill: time to first token", "prompt length (tokens)"),
           "decode": ("decode: time per output token", "decode batch (sequences)")}


def _total_ms(s: dict) -> float | None:
    t = compose.total_us(s)
    return None if t is None else t / 1000


def _key(s: dict) -> tuple:
    return s["model"], s["dtype"], s["phase"], s["batch"], s["length"], s["path"]


def part_terms(rows: list[dict]) -> list[dict]:
    """Per composed step of ``rows`` (``compose.compose``): its point and path, ``total_ms`` (None where a part is
    missing) and ``terms``, each part's share of it in ms: compose's own sum with every other part's time set to
    0, so the terms add up to the total by construction."""
    steps = compose.compose(rows)
    terms: dict[tuple, dict[str, float]] = {_key(s): {} for s in steps}
    for part in PART_COLORS:
        alone = [{**r, "time_us": 0.0} if r["part"] != part and r["time_us"] is not None else r for r in rows]
        for s in compose.compose(alone):
            if (t := _total_ms(s)) is not None:
                terms[_key(s)][part] = t
    return [{**s, "total_ms": _total_ms(s), "terms": terms[_key(s)]} for s in steps]


def step_chart(runs: Runs) -> tuple[str, Figure] | None:
    """The title and figure of the ``step`` chart of the step runs in ``runs``, or None where none has a step with
    a time (``charts.charts`` names it)."""
    check_disjoint(runs.steps)
    steps = [s for run in runs.steps for s in part_terms(records(run))]
    drawn = [s for s in steps if s["total_ms"] is not None]
    if not drawn:
        return None
    panels: dict[tuple, list[dict]] = {}
    for s in sorted(drawn, key=lambda s: (s["model"], s["dtype"], s["phase"] != "prefill", s["batch"],
                                          s["length"], s["path"])):
        panels.setdefault((s["model"], s["dtype"], s["phase"]), []).append(s)
    cols = min(len(panels), MAX_COLS)
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(max(7.0, cols * PANEL_W), rows * PANEL_H + 1.6), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[rows * PANEL_H + 0.9, 0.7])
    present = [p for p in PART_COLORS if any(s["terms"].get(p) for s in drawn)]
    for i, ((model, dtype, phase), bars) in enumerate(panels.items()):
        _panel(top.add_subplot(rows, cols, i + 1), f"{model} {dtype}", phase, bars, present)
    title = "Each step's composition: part time x count per step, per path and point (ms)"
    top.suptitle(title, fontsize=11)
    top.legend(handles=[Patch(color=PART_COLORS[p], label=p) for p in present], loc="outside lower center",
               ncols=len(present), fontsize=8.5, frameon=False)
    bottom.text(0.01, 0.95, _caption(runs, len(steps) - len(drawn)), fontsize=CAPTION_PT, color="0.25", ha="left",
                va="top")
    return title, fig


def _panel(ax, name: str, phase: str, bars: list[dict], present: list[str]) -> None:
    """One model, dtype and phase: a stacked bar per (point, path), its total written above it."""
    heading, xlabel = _PHASES.get(phase, (phase, "point"))
    paths = list(dict.fromkeys(s["path"] for s in bars))
    fixed = sorted({s["batch" if phase == "prefill" else "length"] for s in bars})
    ticks = [str(s["length"] if phase == "prefill" else s["batch"]) + (f"\n{s['path']}" if len(paths) > 1 else "")
             for s in bars]
    x = list(range(len(bars)))
    bottoms = [0.0] * len(bars)
    for part in present:
        heights = [s["terms"].get(part, 0.0) for s in bars]
        ax.bar(x, heights, bottom=bottoms, color=PART_COLORS[part], width=0.7)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for xi, s in zip(x, bars, strict=True):
        ax.annotate(f"{s['total_ms']:,.2f}", (xi, s["total_ms"]), textcoords="offset points", xytext=(0, 2),
                    ha="center", fontsize=7)
    ax.set_xticks(x, ticks, fontsize=7.5)
    pad = max(0.6, (4 - len(bars)) / 2)  # a lone bar stays a bar's width, centred
    ax.set_xlim(-pad, len(bars) - 1 + pad)
    ax.set_ylim(0, max(bottoms) * 1.12)
    where = ("batch " if phase == "prefill" else "context ") + ", ".join(map(str, fixed))
    ax.set_title(f"{name}, {heading} ({where})", fontsize=9.5)
    ax.set_xlabel(xlabel + (" / path" if len(paths) > 1 else f", path {paths[0]}"), fontsize=8.5)
    ax.set_ylabel("ms per step", fontsize=8.5)
    ax.tick_params(axis="y", labelsize=7.5)
    ax.grid(True, axis="y", alpha=0.3)


def _caption(runs: Runs, undrawn: int) -> str:
    """Where the steps ran, the layer counts each model's parts are multiplied by, the runs and their timing."""
    lines = [f"Measured on {Runs(tuple(runs.steps)).machine_line()}"]
    counts = {}
    for run in runs.steps:
        c = run.meta.get("counts") or {}
        counts[run.meta.get("model")] = ", ".join(f"{p} x{n}" for p, n in c.items() if n)
    lines.append("Per step: " + "; ".join(f"{m}: {c}" for m, c in counts.items() if c))
    methods = sorted({str(r.meta.get("timing_method") or "not recorded") for r in runs.steps})
    lines.append(f"Runs: {', '.join(r.label for r in runs.steps)}  ·  timing: {'; '.join(methods)}")
    if undrawn:
        lines.append(f"{undrawn} step(s) lack a part (failed its check or refused): no time, no bar")
    return "\n".join(w for line in lines for w in textwrap.wrap(line, 170, subsequent_indent="  "))
