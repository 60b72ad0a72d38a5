"""PNG charts of benchmark runs, drawn from the report's tables so that a chart and the CLI table never disagree.

``charts(runs)`` builds the charts the rows support, in a fixed order: layer time and share of the roofline
floor versus M (``report.throughput_table``), the triton path's speed-ups (``report.gains_table``), a tune's
gain over the untuned default (``tuned_table``, read from its ``best.json``), the MoE share of time-to-first-token
(``report.prefill_ttft_table``), for CPU-interpreter rows their error against the float32 reference (their
timings say nothing about a GPU, so they get no timing chart), the compile events of trace runs and the composition
of step runs' steps (``step_chart``). Every caption says where the rows were measured
(``Runs.machine_line``) and, under GPU timings, how they were timed. Matplotlib is used through ``Figure`` only
(no pyplot): no global state, nothing shown on a screen.
"""

from __future__ import annotations

import io
import math
import os
import re
import secrets
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatter, NullLocator

from moebench.errors import UserError
from moebench.report import tables as report
from moebench.report.runs import Run, Runs
from moebench.report.step_chart import step_chart
from moebench.report.trace_chart import trace_chart
from moebench.report.tuned import TUNED_COLUMNS, tuned_table
from moebench.store.best import BEST_FILE

__all__ = ["BEST_FILE", "TUNED_COLUMNS", "Chart", "charts", "tuned_table", "write_charts"]


PANEL_W, PANEL_H = 4.3, 3.3  # inches per model panel
MAX_COLS = 3  # panels side by side; more models wrap onto a grid
MIN_W = 7.0  # a one-panel figure still has room for its legend and caption
CAPTION_PT, LEGEND_PT, TICK_PT = 7.5, 8.5, 8
TIMING_CHARS = 70  # a longer timing method is cut to this, parentheses dropped first

_PATH_COLORS = {"triton": "tab:blue", "cutlass": "tab:orange", "triton-classic": "tab:purple", "torch": "tab:green"}
_SPARE_COLORS = ["tab:red", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray"]
_TAB10 = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
          "tab:olive", "tab:cyan"]
_LINESTYLES = ["-", "--", ":", "-."]
_MARKERS = ["o", "s", "^", "D", "v", "P"]
# gains_table's ratios: (column, legend label, what it divides, colour); > 1 means the first named is faster.
_GAINS = [
    ("vs_cutlass", "triton vs cutlass", "cutlass time / triton time", "tab:blue"),
    ("fp8_gain", "fp8 vs bf16", "bf16 time / fp8 time", "tab:red"),
    ("swap_gain", "Swap-AB on vs off", "off time / on time", "tab:green"),
]


@dataclass(frozen=True)
class Chart:
    """One chart: ``name`` is its file stem, ``title`` one line on what it shows."""

    name: str
    title: str
    figure: Figure


@dataclass
class _Series:
    """One line of a panel: its legend label, matplotlib style and points (sorted by x)."""

    label: str
    style: dict
    x: list
    y: list
    order: tuple = ()  # where its legend entry goes
    flags: list = field(default_factory=list)  # per point: False where the point failed its check


# ---- the charts ------------------------------------------------------------------------------------------

def charts(runs: Runs) -> list[Chart]:
    """The charts ``runs`` has data for, in a fixed order: time, floor, gains, tuned, ttft, check, compiles
    (``trace_chart``: the compile events of trace runs), step (``step_chart``: step runs' composition)."""
    df = runs.rows
    if "status" not in df.columns:
        df = pd.DataFrame(columns=["status", "interpreter"])
    interp = report.interpreter_rows(df)
    gpu, cpu = df[~interp], df[interp]
    # the runs whose rows a chart draws, for its caption (a tune's folder may hold no rows)
    gpu_runs = Runs(tuple(r for r in runs.runs if not r.interpreter and len(r.rows)))
    cpu_runs = Runs(tuple(r for r in runs.runs if r.interpreter and len(r.rows)))
    through = report.throughput_table(gpu) if len(gpu) else pd.DataFrame()
    out = [
        _path_chart("time", "MoE layer time per model (lower is faster)", through, "time_us",
                    "layer time (µs, log scale)", "log", gpu_runs),
        _path_chart("floor", "Share of the roofline floor reached (higher is closer to the hardware limit)",
                    through, "pct_of_floor", "roofline floor time / measured time (%)", "linear", gpu_runs),
        _gains_chart(report.gains_table(gpu) if len(gpu) else pd.DataFrame(), gpu_runs),
        _tuned_chart(runs),
    ]
    if len(gpu):
        ttft = report.prefill_ttft_table(gpu).rename(columns={"prompt_len": "M"})
        out.append(_path_chart("ttft", "MoE share of time-to-first-token (lower is faster)", ttft, "moe_ttft_ms",
                               "MoE time of the prefill (ms, log scale)", "log", gpu_runs,
                               xlabel="prompt length (tokens, log scale)"))
    if len(cpu):
        out.append(_check_chart(report.throughput_table(cpu), cpu_runs))
    if (compiles := trace_chart(runs)) is not None:
        out.append(Chart("compiles", *compiles))
    if runs.steps and (step := step_chart(runs)) is not None:
        out.append(Chart("step", *step))
    return [c for c in out if c is not None]


def _path_chart(name: str, title: str, table: pd.DataFrame, y: str, ylabel: str, yscale: str, where: Runs,
                xlabel: str = "M (tokens, log scale)") -> Chart | None:
    """One panel per model, one line per (path, dtype): ``table[y]`` against its M."""
    if table.empty or y not in table.columns:
        return None
    table = table[table[y].notna()]
    panels = {}
    for model, part in table.groupby("model", sort=True):
        panels[model] = [_Series(_label(p, d), _path_style(p, d, table), list(g["M"]), list(g[y].astype(float)),
                                 (p, d))
                         for (p, d), g in part.sort_values("M").groupby(["path", "dtype"], sort=True)]
    if not panels:
        return None
    return _figure(name, title, panels, xlabel=xlabel, ylabel=ylabel, yscale=yscale, caption=_caption(where))


def _gains_chart(gains: pd.DataFrame, where: Runs) -> Chart | None:
    """One panel per model that has a ratio, one line per (ratio, dtype) that has values; 1.0x dashed."""
    if gains.empty:
        return None
    dtypes = sorted(gains["dtype"].unique())
    panels = {}
    for model, part in gains.groupby("model", sort=True):
        lines = []
        for k, (column, text, _, color) in enumerate(_GAINS):
            for dtype, g in part[part[column].notna()].sort_values("M").groupby("dtype", sort=True):
                style = {"color": color, "linestyle": _LINESTYLES[dtypes.index(dtype) % len(_LINESTYLES)],
                         "marker": _MARKERS[dtypes.index(dtype) % len(_MARKERS)]}
                lines.append(_Series(f"{text}, {dtype}", style, list(g["M"]), list(g[column].astype(float)),
                                     (k, dtype)))
        if lines:
            panels[model] = lines
    if not panels:
        return None
    shown = [f"{text} = {ratio}" for column, text, ratio, _ in _GAINS if gains[column].notna().any()]
    return _figure("gains", "Speed-ups of the triton path per model (above 1.0x: the first named is faster)",
                   panels, xlabel="M (tokens, log scale)", ylabel="speed-up (×, time ratio)", yscale="linear",
                   caption=["Speed-ups: " + "; ".join(shown), *_caption(where)], ref=1.0)


def _tuned_chart(runs: Runs) -> Chart | None:
    """One panel, one line per tune run: the tuned config's speed-up over the untuned default per M."""
    table = tuned_table(runs)
    table = table[table["speedup"].notna()]
    if table.empty:
        return None
    lines = []
    labels = table.groupby("run", sort=False)[["model", "dtype", "kernel"]].first()
    texts = [f"{r.model}, {r.dtype}, {r.kernel}" for r in labels.itertuples()]
    for i, (run, g) in enumerate(table.groupby("run", sort=False)):
        text = texts[i] if texts.count(texts[i]) == 1 else f"{texts[i]} ({run})"
        style = {"color": _TAB10[i % len(_TAB10)], "marker": _MARKERS[i % len(_MARKERS)],
                 "linestyle": "-"}
        lines.append(_Series(text, style, list(g["M"]), list(g["speedup"]), (i,)))
    tuned = Runs(tuple(r for r in runs.runs if r.label in set(table["run"])))
    return _figure("tuned", "Tuned config over the untuned default (above 1.0x: tuning made it faster)",
                   {"": lines}, xlabel="M (tokens, log scale)", ylabel="speed-up (×, default time / tuned time)",
                   yscale="linear", caption=_caption(tuned), ref=1.0)


def _check_chart(table: pd.DataFrame, where: Runs) -> Chart | None:
    """Interpreter rows: relative error against the float32 reference per point; failed checks marked ✕."""
    table = table[table["rel_err"].notna()]
    if table.empty:
        return None
    panels = {}
    for model, part in table.groupby("model", sort=True):
        panels[model] = [
            _Series(_label(p, d), _path_style(p, d, table), list(g["M"]), list(g["rel_err"].astype(float)), (p, d),
                    [bool(c) if c is not None and c == c else True for c in g["correct"]])
            for (p, d), g in part.sort_values("M").groupby(["path", "dtype"], sort=True)
        ]
    wrong = int((table["correct"] == False).sum())  # noqa: E712 (None is not False)
    verdict = f"{wrong} of {len(table)} points fail their check" if wrong else f"all {len(table)} points pass"
    return _figure("check", f"Error against the float32 reference, CPU interpreter ({verdict})", panels,
                   xlabel="M (tokens, log scale)", ylabel="relative error ‖out − ref‖ / ‖ref‖",
                   yscale="symlog", caption=_caption(where, timing=False))


def _label(path: str, dtype: str) -> str:
    return f"{path}, {dtype}"


def _path_style(path: str, dtype: str, table: pd.DataFrame) -> dict:
    """A path keeps its colour and a dtype its line and marker in every chart of the same table."""
    paths = [p for p in sorted(table["path"].unique()) if p not in _PATH_COLORS]
    dtypes = sorted(table["dtype"].unique())
    color = _PATH_COLORS.get(path) or _SPARE_COLORS[paths.index(path) % len(_SPARE_COLORS)]
    i = dtypes.index(dtype)
    return {"color": color, "linestyle": _LINESTYLES[i % len(_LINESTYLES)], "marker": _MARKERS[i % len(_MARKERS)]}


# ---- captions --------------------------------------------------------------------------------------------

def _caption(where: Runs, timing: bool = True) -> list[str]:
    """Where the rows ran (device, software, measured ceilings), which runs, and how they were timed."""
    lines = [f"Measured on {where.machine_line()}"]
    if where.interpreter:  # the machine line of an interpreter run says what it is, not which CPU
        lines = [f"Measured on {', '.join(where.devices)}: {where.machine_line()}"]
    tail = "Run: " if len(where.runs) == 1 else "Runs: "
    tail += ", ".join(r.label for r in where.runs)
    if timing:
        methods = {r.label: _short_timing(r) for r in where.runs}
        if len(set(methods.values())) == 1:
            tail += "  ·  timing: " + next(iter(methods.values()))
        else:
            tail += "  ·  timing: " + "; ".join(f"{label}: {m}" for label, m in methods.items())
    return [*lines, tail]


def _short_timing(run: Run) -> str:
    method = str(run.meta.get("timing_method") or "not recorded")
    if len(method) > TIMING_CHARS:
        method = re.sub(r"\s*\([^)]*\)", "", method)
    method = " ".join(method.split())
    return method if len(method) <= TIMING_CHARS else method[: TIMING_CHARS - 1].rstrip() + "…"


# ---- drawing ---------------------------------------------------------------------------------------------

def _figure(name: str, title: str, panels: dict[str, list[_Series]], *, xlabel: str, ylabel: str, yscale: str,
            caption: list[str], ref: float | None = None) -> Chart:
    """Panels side by side (a grid past MAX_COLS), one legend below them all, the caption under it."""
    n = len(panels)
    cols = min(n, MAX_COLS)
    rows = math.ceil(n / cols)
    width = max(MIN_W, cols * PANEL_W)
    handles: dict[str, Line2D] = {}
    for s in sorted((s for lines in panels.values() for s in lines), key=lambda s: s.order):
        handles.setdefault(s.label, Line2D([], [], label=s.label, **s.style))
    if ref is not None:
        handles["1.0x: equal times"] = Line2D([], [], color="0.35", linestyle="--", linewidth=1)
    if any(not all(s.flags) for lines in panels.values() for s in lines):
        handles["check failed"] = Line2D([], [], color="red", marker="X", markersize=9, linestyle="none")
    longest = max(len(k) for k in handles)
    legend_cols = max(1, min(len(handles), int(width // (longest * LEGEND_PT * 0.5 / 72 + 0.6))))
    legend_h = math.ceil(len(handles) / legend_cols) * LEGEND_PT * 1.7 / 72 + 0.2
    chars = int(width * 72 / (CAPTION_PT * 0.52))
    text = "\n".join(w for line in caption for w in textwrap.wrap(line, chars, subsequent_indent="  "))
    caption_h = (text.count("\n") + 1) * CAPTION_PT * 1.4 / 72 + 0.12
    height = rows * PANEL_H + 0.5 + legend_h + caption_h
    fig = Figure(figsize=(width, height), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[height - caption_h, caption_h])
    for i, (model, lines) in enumerate(panels.items()):
        ax = top.add_subplot(rows, cols, i + 1)
        _panel(ax, model, lines, xlabel=xlabel, ylabel=ylabel, yscale=yscale, ref=ref, width=width / cols)
    top.suptitle(title, fontsize=11)
    # matplotlib fills a legend column by column; this order reads row by row, left to right
    order = [i * legend_cols + j for j in range(legend_cols) for i in range(math.ceil(len(handles) / legend_cols))
             if i * legend_cols + j < len(handles)]
    labels = list(handles)
    top.legend(handles=[handles[labels[k]] for k in order], labels=[labels[k] for k in order],
               loc="outside lower center", ncols=legend_cols, fontsize=LEGEND_PT, frameon=False)
    bottom.text(0.01, 0.9, text, fontsize=CAPTION_PT, color="0.25", ha="left", va="top")
    return Chart(name, title, fig)


def _panel(ax, model: str, lines: list[_Series], *, xlabel: str, ylabel: str, yscale: str, ref: float | None,
           width: float) -> None:
    """One model's lines (failed checks overlaid), its axes scaled and labelled; ``width`` in inches."""
    xs = sorted({int(x) for s in lines for x in s.x})
    for s in lines:
        ax.plot(s.x, s.y, label=s.label, linewidth=1.6, markersize=5, **s.style)
        bad = [(x, y) for x, y, ok in zip(s.x, s.y, s.flags or [True] * len(s.x), strict=True)
               if not ok]
        if bad:
            ax.plot(*zip(*bad, strict=True), color="red", marker="X", markersize=9, linestyle="none",
                    label="check failed", zorder=5)
    if ref is not None:
        ax.axhline(ref, color="0.35", linestyle="--", linewidth=1, label="1.0x: equal times", zorder=1)
    if model:
        ax.set_title(model, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=9)
    _y_axis(ax, yscale, [y for s in lines for y in s.y])
    _x_ticks(ax, xs, width - 1.0)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.tick_params(which="both", labelsize=TICK_PT)
    ax.grid(True, which="major", alpha=0.3)


def _y_axis(ax, yscale: str, ys: list[float]) -> None:
    if yscale == "symlog":  # relative errors: an exact 0 (the reference path) sits at the bottom, not off-scale
        nonzero = [abs(y) for y in ys if y]
        linthresh = 10 ** math.floor(math.log10(min(nonzero))) / 10 if nonzero else 1e-8
        ax.set_yscale("symlog", linthresh=linthresh, linscale=0.5)
        top = 10 ** math.ceil(math.log10(max(nonzero))) if nonzero else 1.0
        ax.set_ylim(-linthresh / 3, top)  # a little room under 0, so its markers are not cut in half
    elif yscale == "log":
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    else:
        top = max(ys) if ys else 1.0
        ax.set_ylim(0, top * 1.1 if top > 0 else 1.0)


def _x_ticks(ax, xs: list[int], axis_in: float) -> None:
    """A log2 axis with a tick at every measured value, labelled where the labels do not collide."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(xs))
    ax.xaxis.set_minor_locator(NullLocator())
    lo, hi = min(xs), max(xs)
    if lo == hi:
        ax.set_xlim(lo / 2, hi * 2)
    span = max(math.log2(hi / lo), 2.0) * 1.1  # log2 units across the axis, with matplotlib's margins
    per_unit = axis_in / span  # inches per doubling

    def need(x: int) -> float:  # inches a label takes, gap included
        return len(str(x)) * TICK_PT * 0.6 / 72 + 0.08

    shown: list[int] = []
    for x in xs:
        if not shown or math.log2(x / shown[-1]) * per_unit >= (need(x) + need(shown[-1])) / 2:
            shown.append(x)
    if xs[-1] not in shown:  # the largest M is labelled; the nearest labels before it give way
        while shown and math.log2(xs[-1] / shown[-1]) * per_unit < (need(xs[-1]) + need(shown[-1])) / 2:
            shown.pop()
        shown.append(xs[-1])
    labelled = set(shown)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: str(int(v + 0.5)) if int(v + 0.5) in labelled else ""))


# ---- output ----------------------------------------------------------------------------------------------

def png_bytes(chart: Chart, dpi: int = 120) -> bytes:
    """The chart as PNG bytes."""
    buf = io.BytesIO()
    chart.figure.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def write_charts(runs: Runs, out_dir: Path) -> list[Path]:
    """Each chart as ``<out_dir>/<name>.png`` (a temp file, then renamed); UserError where none can be drawn."""
    made = charts(runs)
    if not made:
        names = ", ".join(r.label for r in runs.runs) or "no runs"
        raise UserError(f"nothing to chart in {names}: no ok GPU rows, no interpreter check, no tune's {BEST_FILE}, "
                        "no step with a time")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for chart in made:
        path = out_dir / f"{chart.name}.png"
        data = png_bytes(chart)
        tmp = out_dir / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        written.append(path)
    return written
