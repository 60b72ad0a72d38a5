"""One self-contained HTML page for one or more runs: what ran where, how it was timed, charts and tables.

The page opens from disk with nothing fetched: inline CSS, no scripts, charts as PNG ``data:`` URIs. Every
cell goes through ``report.format_cell`` and every table comes from ``moebench.report.tables``'s functions, so the
page and the CLI print the same figures; all text taken from rows or metadata is escaped. For a run on the
CPU interpreter the page leads with the warning that its timings are not GPU performance, and its table
shows the check against the float32 reference (``attrs["people_columns"]``) instead of throughput. Step runs
(``moebench step``) get the step's tables (``report.steps``), as the command prints them.
"""

from __future__ import annotations

import base64
import html
import json
import numbers
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from moebench.report import tables as report
from moebench.report.runs import Runs
from moebench.store.atomic import write_text_atomic
from moebench.store.runfolder import run_ref

_CSS = """
:root { --ink: #1d2329; --muted: #5b6670; --rule: #d5dbe1; --zebra: #f3f6f9; --accent: #2458a6; }
* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       max-width: 1200px; margin: 0 auto; padding: 24px 28px 60px; background: #fff; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 36px 0 10px; padding-bottom: 4px; border-bottom: 2px solid var(--rule); }
h3 { font-size: 16px; margin: 22px 0 6px; }
p, ul { margin: 6px 0 10px; }
.lede { color: var(--muted); margin-bottom: 14px; }
code { font: 13px ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
nav { font-size: 14px; color: var(--muted); margin: 8px 0 0; }
nav a { color: var(--accent); text-decoration: none; margin-right: 14px; }
.warn { border: 2px solid #c77700; background: #fff4e0; padding: 10px 14px; margin: 14px 0; border-radius: 4px; }
.warn strong { color: #8a4b00; font-size: 17px; }
.note { color: var(--muted); font-size: 14px; }
.summary { font-weight: 600; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 6px 0 8px; font-size: 13.5px; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px; border-bottom: 1px solid var(--rule); vertical-align: top; text-align: left;
         white-space: nowrap; }
td.wrap { white-space: normal; min-width: 18em; }
th { background: #e8edf2; font-weight: 600; white-space: nowrap; }
tbody tr:nth-child(even) { background: var(--zebra); }
td.num, th.num { text-align: right; white-space: nowrap; }
tr.group td { border-top: 2px solid #9aa5b0; }
table.meta td:first-child { color: var(--muted); white-space: nowrap; }
table.meta td { white-space: normal; overflow-wrap: anywhere; }
figure { margin: 14px 0 22px; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--rule); }
@media print {
  body { max-width: none; padding: 0; font-size: 11pt; }
  nav { display: none; }
  h2 { break-after: avoid; }
  figure, tr { break-inside: avoid; }
  tbody tr:nth-child(even) { background: #f3f3f3; -webkit-print-color-adjust: exact; print-color-adjust: exact; }
}
"""

# (section id, heading) in page order; the nav links to those the page has.
_SECTIONS = [("machine", "Machine"), ("method", "Method"), ("charts", "Charts"), ("tables", "Tables"),
             ("failures", "Points not timed"), ("metadata", "Run metadata")]
# What the machine table shows of each run's meta.json, in order: (key, label).
_MACHINE_FIELDS = [("device_name", "device"), ("gpu_capability", "compute capability"), ("gpu_sms", "SMs"),
                   ("gpu_memory_gib", "memory (GiB)"), ("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch"),
                   ("triton", "triton"), ("python", "python"), ("host", "host")]
_FAILURE_KEY = ["status", "model", "dtype", "path", "error"]  # failed points grouped by these; M listed
_WRAPPED = {"config", "error"}  # text columns that may be long: they wrap, the others do not


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _when(stamp: object) -> str:
    """A meta.json UTC stamp ('2026-12-01T08:34:51Z') as people read it; '-' where absent."""
    if not stamp:
        return "-"
    return str(stamp).replace("T", " ").removesuffix("Z") + (" UTC" if str(stamp).endswith("Z") else "")


def _numeric(values: Iterable[object]) -> bool:
    """Numbers only (missing values aside): the column is right-aligned."""
    present = [v for v in values if v is not None and not (isinstance(v, float) and np.isnan(v))]
    return bool(present) and all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))
                                 for v in present)


def table_html(table: pd.DataFrame, cls: str = "") -> str:
    """``table`` as an HTML table, each cell ``report.format_cell``; only ``attrs["people_columns"]`` where set.

    Numeric columns are right-aligned; where the rows carry a model (and dtype), the first row of each
    new one gets a rule above it so the groups read apart.
    """
    if people := table.attrs.get("people_columns"):
        table = table[list(people)]
    columns = [str(c) for c in table.columns]
    num = {c: _numeric(table[c]) for c in columns}
    head = "".join(f'<th{" class=num" if num[c] else ""}>{_e(c)}</th>' for c in columns)
    group_cols = [c for c in ("model", "dtype") if c in columns]
    rows, last = [], None
    for rec in table.itertuples(index=False, name=None):
        cells = dict(zip(columns, rec, strict=True))
        group = tuple(cells[c] for c in group_cols)
        starts = group_cols and last is not None and group != last
        last = group
        tds = "".join(f"<td{_cell_class(c, num[c])}>{_e(report.format_cell(c, cells[c]))}</td>" for c in columns)
        rows.append(f"<tr{' class=group' if starts else ''}>{tds}</tr>")
    attr = f' class="{_e(cls)}"' if cls else ""
    return (f'<div class="scroll"><table{attr}><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _cell_class(column: str, numeric: bool) -> str:
    return " class=num" if numeric else " class=wrap" if column in _WRAPPED else ""


def _definitions(pairs: Iterable[tuple[str, str]]) -> str:
    """A small two-column table of (name, text) pairs; both escaped here."""
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in pairs)
    return f'<table class="meta"><tbody>{body}</tbody></table>'


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _counts(runs: Runs) -> str:
    """What the runs hold: benchmark rows (sweeps, tunes) and traced requests, each where there are any."""
    requests = sum(len(r.rows) for r in runs.traces)
    step_parts = sum(len(r.rows) for r in runs.steps)
    parts = [_plural(len(runs.rows), "row")] if len(runs.rows) or not (requests or step_parts) else []
    parts += [_plural(step_parts, "step part row")] if step_parts else []
    return ", ".join(parts + ([_plural(requests, "traced request")] if requests else []))


def _header(runs: Runs, page_dir: Path | None) -> str:
    labels = [r.label for r in runs.runs]
    commits = list(dict.fromkeys(str(r.meta.get("git_commit") or "unknown") for r in runs.runs))
    starts = sorted(str(r.meta["started"]) for r in runs.runs if r.meta.get("started"))
    ends = sorted(str(r.meta["finished"]) for r in runs.runs if r.meta.get("finished"))
    when = f"{_when(starts[0])} to {_when(ends[-1])}" if starts and ends else _when(starts[0] if starts else None)
    sweeps = list(dict.fromkeys(str(r.meta["sweep"]) for r in runs.runs if r.meta.get("sweep")))
    what = f"sweep {', '.join(sweeps)}; " if sweeps else ""
    models = list(dict.fromkeys(f"{r.meta.get('model')} {r.meta.get('dtype')}" for r in runs.steps))
    what += f"step {', '.join(models)}; " if models else ""
    parts = [f"<h1>moebench: {_e(', '.join(labels) or 'no runs')}</h1>",
             f'<p class="lede">{len(labels)} run{"s" * (len(labels) != 1)}, {_e(_counts(runs))}; {_e(what)}'
             f"ran {_e(when)}; commit {_e(', '.join(commits))}; on {_e(', '.join(runs.devices))}</p>"]
    interp = [r.label for r in runs.runs if r.interpreter]
    if interp:
        which = "this run" if len(interp) == len(labels) == 1 else "runs " + ", ".join(interp)
        parts.append(f'<div class="warn"><strong>{_e(report.INTERPRETER_CAPTION)}.</strong> '
                     f"The kernels of {_e(which)} ran on the CPU through the Triton interpreter: what such a run "
                     "shows is whether each point matches the float32 reference, not how fast it is.</div>")
    if runs.warnings:
        items = "".join(f"<li>{_e(_from_page(w, runs, page_dir))}</li>" for w in runs.warnings)
        parts.append(f'<div class="warn"><strong>Read with care</strong><ul>{items}</ul></div>')
    return "\n".join(parts)


def _nav(present: list[str]) -> str:
    links = "".join(f'<a href="#{sid}">{_e(title)}</a>' for sid, title in _SECTIONS if sid in present)
    return f"<nav>{links}</nav>"


def _section(sid: str, body: str) -> str:
    title = dict(_SECTIONS)[sid]
    return f'<section id="{sid}"><h2>{_e(title)}</h2>\n{body}\n</section>'


def _tb(gbps: float | None) -> str:
    return f"{gbps / 1000:.2f} TB/s" if gbps else "-"


def _tf(tflops: float | None) -> str:
    return f"{tflops:.0f} TFLOP/s" if tflops else "-"


def _machine(runs: Runs) -> str:
    """Where each run ran and the ceilings it measured: one column per run."""
    fields = [(label, lambda m, k=key: report.format_cell(k, m.get(k))) for key, label in _MACHINE_FIELDS]
    fields += [("read bandwidth", lambda m: _tb((m.get("ceilings") or {}).get("read_gbps"))),
               ("copy bandwidth", lambda m: _tb((m.get("ceilings") or {}).get("copy_gbps"))),
               ("bf16 matmul", lambda m: _tf((m.get("ceilings") or {}).get("bf16_tflops"))),
               ("fp8 matmul", lambda m: _tf((m.get("ceilings") or {}).get("fp8_tflops")))]
    head = "<th></th>" + "".join(f"<th>{_e(r.label)}</th>" for r in runs.runs)
    body = []
    for label, get in fields:
        values = [get(r.meta) for r in runs.runs]
        if any(v != "-" for v in values):  # a field no run recorded (a GPU's on a CPU run) is left out
            body.append(f"<tr><td>{_e(label)}</td>" + "".join(f"<td>{_e(v)}</td>" for v in values) + "</tr>")
    lines = [f"<p class=summary>{_e(runs.machine_line())}</p>"]
    if any(r.meta.get("ceilings") for r in runs.runs):
        lines.append('<p class="note">Ceilings are measured by each run before its points, never taken from a '
                     "data sheet: read bandwidth from a reduction over a large tensor, copy bandwidth as bytes read "
                     "plus written, matmul rates from 8192<sup>3</sup> products on random data.</p>")
    table = f'<div class="scroll"><table class="meta"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}' \
            "</tbody></table></div>"
    return "\n".join([*lines, table])


def _method(runs: Runs) -> str:
    methods: dict[str, list[str]] = {}
    for r in runs.runs:
        methods.setdefault(str(r.meta.get("timing_method") or "not recorded"), []).append(r.label)
    if len(methods) == 1:
        timing = f"<li><b>Timing</b>: {_e(next(iter(methods)))}.</li>"
    else:
        timing = "".join(f"<li><b>Timing</b> of {_e(', '.join(labels))}: {_e(m)}.</li>"
                         for m, labels in methods.items())
    if runs.steps:
        return (f"<ul>{timing}<li><b>Checked first</b>: each part of the step (attention, router, the MoE layer per "
                "path, shared expert, dense MLP, LM head) is run against a float32 run of the same computation, "
                "within its dtype's tolerance, then timed (the torch MoE path is the reference and is not "
                "checked).</li><li><b>Composed</b>: a step's time is each part's time x how many of it the model "
                "runs (<code>count</code>), summed; the tensor-parallel all-reduces are modelled from a bus "
                "bandwidth, in their own column. <code>moe_pct</code>: the MoE layers' share of the measured "
                "step; <code>layer_vs</code> and <code>e2e_vs</code>: the <code>--vs</code> path's MoE layer and "
                "step time over this path's (above 1: this path is faster). A step lacking a part has no time and "
                "names it (<code>missing</code>). The <code>stack</code> table times real consecutive layers whole "
                "beside the sum of their parts.</li></ul>")
    if runs.rows.empty and runs.traces:  # traces only: requests replayed, no checked point, floor or layer time
        return (f"<ul>{timing}<li>Each trace replays its requests through the MoE layer and records when each "
                "one's kernels compiled and ran: the cold-start table below.</li></ul>")
    check = ("<li><b>Checked first</b>: every point is run once into a NaN-poisoned output and checked against a "
             "plain-PyTorch float32 reference, within its dtype's tolerance, before it is timed; only a correct "
             "point is timed (the torch path is the reference and is not checked).</li>")
    if runs.interpreter:
        return (f"<ul>{timing}{check}<li><code>correct</code>: whether the point passed that check; "
                "<code>rel_err</code>: its relative error against the reference. The interpreter's wall-clock "
                "times are no GPU figure: the page shows no throughput, % of floor or TTFT for them.</li></ul>")
    items = [
        timing, check,
        "<li><b>% of floor</b> (<code>pct_of_floor</code>) = roofline floor / measured time. The floor is the "
        "larger of bytes the layer must move / memory ceiling and FLOPs / matmul ceiling of its dtype, with the "
        "ceilings measured in the same run (above); 100% would be the hardware's limit.</li>",
        "<li><code>time_us</code>: one MoE layer in microseconds; <code>tflops</code>, <code>gbps</code>: "
        "achieved rates; <code>decode_tok_s</code> = M / (MoE layers x time): tokens per second through the "
        "model's MoE layers, MoE time only.</li>",
    ]
    return f"<ul>{''.join(items)}</ul>"


def _charts(charts: list, dpi: int) -> str:
    from moebench.report import charts as plot

    out = []
    for chart in charts:
        data = base64.b64encode(plot.png_bytes(chart, dpi=dpi)).decode("ascii")
        # Shown at 96 px per inch of figure (at most the page's width), so every chart's text is one size; the
        # chart draws its own title, and the alt text repeats it for a reader without images.
        width = int(float(chart.figure.get_size_inches()[0]) * 96 + 0.5)
        out.append(f'<figure><img src="data:image/png;base64,{data}" width="{width}" alt="{_e(chart.title)}">'
                   "</figure>")
    return "\n".join(out)


def _caption(table: pd.DataFrame) -> str:
    cap = table.attrs.get("caption")
    return f'<p class="note"><b>{_e(cap)}</b></p>' if cap else ""


def _step_tables(runs: Runs) -> str:
    """The step runs' tables as ``moebench step`` prints them (``report.steps``), and what their parts model."""
    from moebench.report import steps

    tables = steps.run_tables(runs.steps)
    label, single = steps.title_label(tables)
    titles = {"ttft": "Time to first token", "decode": "Decode: time per output token and tokens/s",
              "stack": "Composition check: layers timed whole against their parts", "parts": "The parts"}
    out = []
    for name in steps.STEP_TABLES:
        out += [f"<h3>{_e(titles[name])} ({_e(name)}: {_e(label)})</h3>",
                table_html(steps.people_view(tables[name], single)), _caption(tables[name])]
    lines = steps.notes([r for run in runs.steps for r in steps.records(run)])
    if lines:
        out.append("<ul class=note>" + "".join(f"<li>{_e(line)}</li>" for line in lines) + "</ul>")
    return "\n".join(out)


def _tables(runs: Runs, tuned: pd.DataFrame | None) -> str:
    if runs.steps:
        return _step_tables(runs)
    df = runs.rows
    cold = []
    if runs.traces:
        table = report.cold_start_table(runs.traces)
        cold = ["<h3>Cold start of the MoE kernels (trace)</h3>", f'<p class="note">{_e(table.attrs["caption"])}</p>',
                table_html(table)]
    if df.empty:
        return "\n".join(cold) or "<p>No rows.</p>"
    out = []
    through = report.throughput_table(df)
    title = "Correctness (CPU interpreter)" if report.is_interpreter_run(df) else "Throughput (MoE layer)"
    out += [f"<h3>{_e(title)}</h3>", table_html(through), _caption(through)]
    ttft = report.prefill_ttft_table(df)
    if len(ttft):
        out += ["<h3>MoE share of time-to-first-token</h3>",
                f'<p class="note">{_e(report.TTFT_NOTE)}</p>', table_html(ttft)]
    gpu = df[~report.interpreter_rows(df)]  # ratios of interpreter wall-clock times say nothing: GPU rows only
    gains = report.gains_table(gpu) if len(gpu) else pd.DataFrame()
    if len(gains):
        geo, low = report.geomean_pct_of_floor(gains)
        out += ["<h3>Triton gains</h3>",
                '<p class="note">Per triton point: its best time and config, and three ratios (above 1: the '
                "first is faster): <code>swap_gain</code> = no-swap / Swap-AB time, <code>fp8_gain</code> = bf16 / "
                "fp8 time at the same model and M, <code>vs_cutlass</code> = cutlass / triton time.</p>",
                table_html(gains)]
        if pd.notna(geo):  # no % of floor where no run measured ceilings (a tune run)
            summary = f"{len(gains)} points: geometric mean {geo:.1f}% of floor, lowest {low:.1f}%"
            out.append(f"<p class=summary>{_e(summary)}</p>")
    if tuned is not None and len(tuned):
        out += ["<h3>Tuned configs</h3>",
                '<p class="note">From the tune runs\' best configs: the chosen config\'s time beside the '
                "default config's, and the speedup (default / chosen).</p>", table_html(tuned)]
    return "\n".join(out + cold)


def _failures(df: pd.DataFrame) -> str:
    """The points that were not timed (unsupported, incorrect, failed): one line per status, point and error,
    with the M values it covers."""
    if df.empty or "status" not in df.columns:
        return ""
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return ""
    bad = bad.assign(**{c: bad[c].astype(object).where(bad[c].notna(), "-") if c in bad else "-"
                        for c in _FAILURE_KEY})
    grouped = (bad.groupby(_FAILURE_KEY, sort=False)["M"]
               .agg(lambda ms: ", ".join(report.format_cell("M", m) for m in sorted(set(ms))))
               .reset_index())
    grouped = grouped[["status", "model", "dtype", "path", "M", "error"]]
    counts = ", ".join(f"{n} {s}" for s, n in bad["status"].value_counts().items())
    return (f"<p>{len(bad)} rows were not timed ({_e(counts)}). Each line is one model, dtype and path with "
            "the M values it covers.</p>" + table_html(grouped))


def _meta_value(key: str, value: object) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return report.format_cell(key, value)


def _where(path: Path, page_dir: Path | None) -> str:
    """A run folder as the page names it: from the page's folder, or by its name."""
    return path.name if page_dir is None else run_ref(path, page_dir)


def _from_page(text: str, runs: Runs, page_dir: Path | None) -> str:
    """``text`` (a load's warning, which names the folder as the command line did) with each run's absolute path
    named from the page (a relative one names no machine's folders and stays)."""
    for r in runs.runs:
        text = text.replace(str(r.path.absolute()), _where(r.path, page_dir))
    return text


# An absolute path in a meta.json value (the command line's folders, trace's configs_dir, cache_dir, csv:<file>).
_ABSOLUTE = re.compile(r"(?:(?<=^)|(?<=[\s=:\[\"']))(/[^\s\"',\]]+)")


def _unrooted(text: str, page_dir: Path | None) -> str:
    """``text`` with each absolute path named as the page names a run (from its folder, or by its last name)."""
    return _ABSOLUTE.sub(lambda m: _where(Path(m.group(1)), page_dir), text)


def _metadata(runs: Runs, page_dir: Path | None) -> str:
    out = []
    for r in runs.runs:
        out.append(f"<h3>{_e(r.label)}</h3><p class=note>{_e(_where(r.path, page_dir))}</p>")
        out.append(_definitions((str(k), _unrooted(_meta_value(str(k), v), page_dir)) for k, v in r.meta.items()))
    return "\n".join(out)


def render_html(runs: Runs, charts: list | None = None, tuned: pd.DataFrame | None = None, dpi: int = 120,
                page_dir: Path | None = None) -> str:
    """The page for ``runs``: header, machine and ceilings, method, charts, tables, failed points, metadata.

    ``charts`` (``plot.Chart``s) defaults to ``plot.charts(runs)`` and ``tuned`` to ``plot.tuned_table(runs)``;
    tests pass their own. Charts are embedded as PNG data URIs at ``dpi``. Each run's folder is named from
    ``page_dir``, the page's folder (``run_ref``: no absolute path), or by its name where that is None.
    """
    if charts is None or tuned is None:
        from moebench.report import charts as plot

        charts = plot.charts(runs) if charts is None else charts
        tuned = plot.tuned_table(runs) if tuned is None else tuned
    sections = {"machine": _machine(runs), "method": _method(runs)}
    if charts:
        sections["charts"] = _charts(charts, dpi)
    sections["tables"] = _tables(runs, tuned)
    if failed := _failures(runs.rows):
        sections["failures"] = failed
    sections["metadata"] = _metadata(runs, page_dir)
    title = "moebench: " + (", ".join(r.label for r in runs.runs) or "no runs")
    body = "\n".join([_header(runs, page_dir), _nav(list(sections)), *(_section(s, b) for s, b in sections.items())])
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{_e(title)}</title>\n<style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n")


def write_html(runs: Runs, path: Path, **kw) -> Path:
    """Write ``render_html(runs, **kw)`` to ``path`` through a temp file beside it, renamed; returns ``path``."""
    path = Path(path)
    write_text_atomic(path, render_html(runs, page_dir=path.parent, **kw))
    return path
