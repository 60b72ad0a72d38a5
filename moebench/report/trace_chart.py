"""The compile events along a replayed serving trace (``moebench trace`` run folders), as one chart.

Left: kernel variants compiled so far against the request index, a line per trace run (cold, after
warm-up, specialized), so a reader sees whether compiling stops after the first requests. Right: each
request's excess over its warm replay (ms, log), the cost a user waits for. Both are drawn from
``trace.requests_table`` of the run's rows, the table the trace prints. Interpreter traces compile nothing
and get no chart.
"""

from __future__ import annotations

import textwrap

from matplotlib.figure import Figure

from moebench.report.runs import Run, Runs

CAPTION_PT = 7.5


def _label(run: Run) -> str:
    m = run.meta
    mode = m.get("cache_mode", "?") + (", specialized" if m.get("specialize") else "")
    return f"{m.get('model')} {m.get('dtype')}, {mode}"


def _count(replayed: int, requested) -> str:
    """The requests a trace replayed, and those asked for where it stopped short of them."""
    if requested in (None, replayed):
        return f"{replayed} requests"
    return f"{replayed} of {requested} requests replayed"


def trace_chart(runs: Runs) -> tuple[str, Figure] | None:
    """The title and figure of the ``compiles`` chart of the GPU trace runs in ``runs``, or None where there is
    none (``charts.charts`` names it)."""
    from moebench.report.trace_summary import requests_table

    traces = [r for r in runs.traces if not r.interpreter and len(r.rows)]
    if not traces:
        return None
    fig = Figure(figsize=(10, 4.6), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[4.0, 0.6])
    left, right = top.subplots(1, 2)
    replayed = {}  # run label -> its requests replayed (rows), which a stopped trace has fewer of than asked
    for run in traces:
        req = requests_table(run.rows.to_dict("records")).sort_values("i")
        replayed[run.label] = len(req)
        compiled = req["compiles"].fillna(0).astype(int).cumsum()
        line, = left.step(req["i"], compiled, where="post", label=_label(run))
        excess = req["excess_ms"].clip(lower=1e-3)
        right.plot(req["i"], excess, linestyle="none", marker=".", markersize=4, color=line.get_color())
    left.set_xlabel("request (in arrival order)")
    left.set_ylabel("kernel variants compiled so far")
    left.set_title("Compilation along the trace", fontsize=10)
    right.set_xlabel("request (in arrival order)")
    right.set_ylabel("first call - warm replay (ms, log scale)")
    right.set_yscale("log")
    right.set_title("Each request's excess latency", fontsize=10)
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    top.legend(loc="outside lower center", ncols=min(3, len(traces)), fontsize=8.5, frameon=False)
    title = "Kernel compilation while replaying serving traffic (MoE layer, triton path)"
    top.suptitle(title, fontsize=11)
    where = Runs(tuple(traces))
    lines = [f"Measured on {where.machine_line()}",
             "Traces: " + "; ".join(f"{r.label}: {_count(replayed[r.label], r.meta.get('requests'))}, "
                                    f"{r.meta.get('distribution')}" for r in traces)]
    text = "\n".join(w for line in lines for w in textwrap.wrap(line, 180, subsequent_indent="  "))
    bottom.text(0.01, 0.9, text, fontsize=CAPTION_PT, color="0.25", ha="left", va="top")
    return title, fig
