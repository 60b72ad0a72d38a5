"""The commands that read run folders: ``report`` (tables, ``--html``), ``compare`` (two runs, a baseline
gate, or variants within a run) and ``plot``. Each loads its runs once (``moebench.report.runs``) and hands them
to library functions, so every output of a run comes from the same rows. Step runs (``moebench step``) get the
step's own tables and comparison (``moebench.report.steps``)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from moebench.cli.console import FORMATS, GivenPath, NonNegative, emit, note, out_console
from moebench.report.steps import STEP_TABLES

SWEEP_TABLES = ("throughput", "ttft", "tuned", "cold_start")
TABLES = tuple(dict.fromkeys([*SWEEP_TABLES, *STEP_TABLES]))


def load_runs(paths):
    """The runs under ``paths`` (run folders or folders of run folders), their warnings said on stderr."""
    from moebench.report import runs

    loaded = runs.load(list(paths))
    for w in loaded.warnings:
        note(w)
    return loaded


def print_tables(df, fmt: str, out, which: str | None = None, traces=(), tuned=None) -> None:
    """The throughput table (for an interpreter run: its check against the fp32 reference), for GPU rows at
    prefill-sized M the TTFT table, for tune runs the tuned table (``tuned``: ``report.tuned.tuned_table``) and
    for trace runs the cold-start table; ``which`` keeps one. CSV is always one table (throughput unless
    ``which`` says another); JSON holds the tables under their names. A tune's failed candidates are counted on
    stderr; a sweep's failed points are listed under the tables."""
    import json

    from rich.text import Text

    from moebench.report import tables as report
    from moebench.report.tuned import failures_line, tune_rows

    tables = {"throughput": report.throughput_table(df), "ttft": report.prefill_ttft_table(df)}
    if tuned is not None and len(tuned):
        tables["tuned"] = tuned
    if traces:
        tables["cold_start"] = report.cold_start_table(traces)
    if which:
        if which not in tables:
            from moebench.errors import UserError

            needs = {"tuned": "a tune's run folder, with its best.json", "cold_start": "a trace run folder"}.get(
                which, "a step run folder")
            raise UserError(f"--table {which}: no run named has that table (it needs {needs})")
        tables = {which: tables[which]}
    if fmt == "table":
        titles = {"throughput": "Correctness (CPU interpreter)" if report.is_interpreter_run(df)
                  else "Throughput (MoE layer)", "ttft": "MoE share of time-to-first-token",
                  "tuned": "Tuned config against the untuned default (speedup = default_us / time_us)",
                  "cold_start": "Cold start of the MoE kernels (trace)"}
        for name, table in tables.items():
            if len(table) or which or (name == "throughput" and not traces):
                report.render(table, "table", titles[name], console=out)
        failed = df[(df["status"] != "ok") & ~tune_rows(df)] if len(df) else df
        for _, r in failed.iterrows():
            line = Text(str(r["status"]), style="yellow")
            line.append(f": {r['model']} {r['dtype']} M={r['M']} {r['path']}: {r['error']}")
            out.print(line)
    elif fmt == "csv":
        emit(report.render(tables[which or "throughput"], "csv", which or "throughput"))
    else:
        click.echo(json.dumps({name: json.loads(report.render(t, "json", name)) for name, t in tables.items()},
                              indent=2))
    if len(df) and (line := failures_line(df)):
        note(line)


def print_step_tables(tables: dict, fmt: str, out, which: str | None = None, head: dict | None = None,
                      notes=()) -> None:
    """A step's tables (``report.steps.step_tables``): ttft, decode and stack (and cold_start where a trace gave
    one), or ``which``. For people, titled
    with the model and dtype (their columns left out where there is one of each), ``notes`` under them on
    stderr; CSV is one table (ttft unless ``which`` says another); JSON holds the tables under their names, after
    ``head`` (e.g. the run folder)."""
    import json

    from moebench.report import steps
    from moebench.report.tables import render

    chosen = [which] if which else [*steps.SHOWN, *(["cold_start"] if "cold_start" in tables else [])]
    if fmt == "json":
        emit(json.dumps({**(head or {}), **{k: json.loads(render(tables[k], "json", k)) for k in chosen}}, indent=2))
    elif fmt == "csv":
        emit(render(tables[which or "ttft"], "csv", which or "ttft"))
    else:
        label, single = steps.title_label(tables)
        for name in chosen:
            render(steps.people_view(tables[name], single), "table", f"{name}: {label}", console=out,
                   caption=tables[name].attrs.get("caption") or "")
        for line in notes:
            note(f"note: {line}")


def _report_steps(loaded, fmt: str, which: str | None) -> None:
    """``report`` of step runs: the tables ``moebench step`` prints, of every run named taken together."""
    from moebench.errors import UserError
    from moebench.report import steps

    known = (*STEP_TABLES, "cold_start") if loaded.traces else STEP_TABLES
    if which is not None and which not in known:
        more = " (cold_start with a trace run named beside)" if which == "cold_start" else ""
        raise UserError(f"--table {which}: a step run has the tables {', '.join(STEP_TABLES)}{more}")
    tables = steps.run_tables(loaded.steps)
    if loaded.traces:
        tables["cold_start"] = steps.cold_start_table(tables["ttft"], loaded.traces)
    rows = [r for run in loaded.steps for r in steps.records(run)]
    print_step_tables(tables, fmt, out_console(), which, notes=steps.notes(rows))


@click.command()
@click.argument("runs", nargs=-1, required=True, type=GivenPath(path_type=Path))
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--table", "which", type=click.Choice(TABLES), default=None,
              help="Print only this table (csv prints one table: throughput, or ttft for step runs, unless this "
                   "names another; cold_start needs a trace run folder, decode, stack and parts a step run "
                   "folder).")
@click.option("--gains", is_flag=True,
              help="Instead: per triton point, best config and the Swap-AB, fp8 and vs-cutlass gains (and the "
                   "git commit of its run, where the runs named differ). GPU runs only.")
@click.option("--html", "html_out", type=GivenPath(path_type=Path, dir_okay=False), default=None,
              help="Also write one self-contained HTML page (charts, tables, machine, ceilings, method).")
@click.option("--peer", "peer_file", type=GivenPath(path_type=Path, dir_okay=False), default=None,
              help="Instead: each triton point against another kernel's times on the same points (JSON Lines of "
                   "model, dtype, M and a time in us), speedup = peer / run, and their geometric mean.")
@click.option("--peer-field", default="time_us", show_default=True,
              help="With --peer: the field of each line that holds the peer's time in us (e.g. vllm_gemms_us).")
def report(runs, fmt, which, gains, html_out, peer_file, peer_field):
    """Print the tables of one or more run folders (rows taken together; each row keeps the floor of its
    own run's ceilings). A folder of run folders (a baseline) counts as its runs. Step run folders (moebench
    step, named only with step runs) print the step's TTFT, decode, stack and parts tables."""
    from moebench.errors import UserError
    from moebench.report import tables as rep

    loaded = load_runs(runs)
    if loaded.steps and (gains or peer_file is not None):
        raise UserError(f"{'--gains' if gains else '--peer'} reads a sweep's MoE-layer points; step runs hold a "
                        "model's steps (their tables set the paths side by side: layer_vs, e2e_vs)")
    df = loaded.rows
    if html_out is not None:
        from moebench.report.page import write_html

        write_html(loaded, html_out)
        note(f"report page: {html_out}")
    if peer_file is not None:
        _peer(df, peer_file, peer_field, fmt, runs)
        return
    if loaded.steps:
        return _report_steps(loaded, fmt, which)
    if not gains:
        from moebench.report.tuned import tuned_table

        print_tables(df, fmt, out_console(), which, loaded.traces, tuned_table(loaded))
        return
    if rep.is_interpreter_run(df):
        raise UserError("--gains sets GPU timings side by side; these rows come from the CPU interpreter, whose "
                        "timings are not GPU performance (compare --by checks their correctness)")
    table = rep.gains_table(df)
    if fmt == "table":
        rep.render(table, "table", f"triton gains: {', '.join(map(str, runs))}", console=out_console())
        geo, low = rep.geomean_pct_of_floor(table)
        if table.empty or geo != geo:  # NaN: no % of floor to summarise
            out_console().print(f"{len(table)} points, none with a % of floor")
        else:
            out_console().print(f"{len(table)} points: geometric mean {geo:.1f}% of floor, lowest {low:.1f}%")
    else:
        emit(rep.render(table, fmt, "gains"))


def _peer(df, peer_file: Path, field: str, fmt: str, runs) -> None:
    """``report --peer``: the run's triton points against the peer's times (``report.peer``)."""
    from moebench.errors import UserError
    from moebench.report import peer as pr
    from moebench.report import tables as rep

    if rep.is_interpreter_run(df):
        raise UserError("--peer sets GPU timings side by side; these rows come from the CPU interpreter")
    peer = pr.read_peer(peer_file, field)
    table = pr.peer_table(df, peer)
    if fmt == "table":
        rep.render(table, "table", f"against {peer_file.name}: {', '.join(map(str, runs))}", console=out_console())
        out_console().print(pr.summary(table, len(peer)))
    else:
        emit(rep.render(table, fmt, "peer"))


@click.command()
@click.argument("runs", nargs=-1, required=True, type=GivenPath(path_type=Path))
@click.option("--by", type=click.Choice(["path", "dtype", "swap_ab"]), default=None,
              help="Compare the variants of each point within ONE run (or baseline folder) instead of two runs.")
@click.option("--base", "base_variant", default=None,
              help="With --by: the variant the others are set against [default: cutlass, bf16, off].")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--threshold", default=0.03, show_default=True, type=NonNegative(),
              help="Smallest relative change called FASTER/SLOWER, whatever the measured noise.")
@click.option("--fail-slower", "fail_pct", type=NonNegative(), default=None, metavar="PCT",
              help="A regression gate: exit 1 naming the points more than PCT% slower than BASE and beyond noise "
                   "(or ok in BASE and failed now); exit 2 for runs of different GPUs or problems.")
@click.option("--fail-on-slower", is_flag=True, help="Exit 1 when any point is SLOWER (same as --fail-slower 0).")
def compare(runs, by, base_variant, fmt, threshold, fail_pct, fail_on_slower):
    """Compare BASE NEW point by point (SAME / FASTER / SLOWER / UNKNOWN against the noise of both), or
    RUN --by path|dtype|swap_ab: variants of the same point side by side.

    BASE may be a folder of several runs of one sweep (a baseline, results/baselines/...): its points take
    the median of its runs and its noise includes the spread between them. CPU-interpreter runs are
    compared for correctness only (CORRECT / BROKEN / FIXED / INCORRECT).

    Step runs (moebench step) are compared step by step: each path's TTFT or per-token time at each point,
    its noise the spread of its parts' timings."""
    from moebench.errors import UserError
    from moebench.report import compare as cmp

    if by is not None:
        if len(runs) != 1 or fail_pct is not None or fail_on_slower:
            raise UserError("--by compares variants within one run: name one RUN, without a gate")
        return _compare_within(runs[0], by, base_variant, fmt, threshold)
    if len(runs) != 2:
        raise UserError(f"compare takes BASE and NEW (got {len(runs)} folder(s)); or one RUN with --by")
    if base_variant is not None:
        raise UserError("--base goes with --by")
    base_runs, new_runs = load_runs(runs[:1]), load_runs(runs[1:])
    if base_runs.steps or new_runs.steps:
        if fail_pct is not None or fail_on_slower:
            raise UserError("the gate (--fail-slower, --fail-on-slower) reads sweeps; compare step runs without it")
        return _compare_steps(base_runs, new_runs, runs, fmt, threshold)
    base_df, new_df = base_runs.rows, new_runs.rows
    cmp.check_comparable(base_df, new_df)  # an interpreter run against a GPU run: one error, no warning first
    if fail_on_slower and fail_pct is None:
        fail_pct = 0.0
    if fail_pct is not None:
        return _gate(base_df, new_df, runs, fail_pct, threshold, fmt, len(base_runs.runs))
    if w := cmp.device_mismatch(base_df, new_df):
        note(f"warning: {w}")
    if cmp.is_interpreter(base_df):
        table, title = cmp.check_table(base_df, new_df), f"Correctness (CPU interpreter): {runs[0]} -> {runs[1]}"
    else:
        table, title = cmp.compare_runs(base_df, new_df, min_threshold=threshold), f"{runs[0]} -> {runs[1]}"
    _show(table, fmt, title)
    if fmt == "table" and len(only := cmp.unmatched(base_df, new_df)):
        note(f"{len(only)} point(s) present in one run only")


def _compare_steps(base_runs, new_runs, names, fmt: str, threshold: float) -> None:
    """``compare BASE NEW`` of step runs: per composed step, the two sides' times and a verdict against noise
    (``report.steps``); interpreter runs, the check only."""
    from moebench.errors import UserError
    from moebench.report import compare as cmp
    from moebench.report import steps

    if not (base_runs.steps and new_runs.steps):
        step, other = (names[0], names[1]) if base_runs.steps else (names[1], names[0])
        raise UserError(f"{step} holds step runs (moebench step) and {other} none: compare step runs with step runs")
    base, new = steps.step_points(base_runs.steps), steps.step_points(new_runs.steps)
    cmp.check_comparable(base, new)
    if w := cmp.device_mismatch(base, new):
        note(f"warning: {w}")
    if cmp.is_interpreter(base):
        table, title = steps.check_steps(base, new), f"Correctness (CPU interpreter): {names[0]} -> {names[1]}"
    else:
        table, title = steps.compare_steps(base, new, min_threshold=threshold), f"steps: {names[0]} -> {names[1]}"
    _show(table, fmt, title)
    if fmt == "table" and len(only := steps.unmatched_steps(base, new)):
        note(f"{len(only)} step(s) with a time in one run only")


def _show(table, fmt: str, title: str) -> None:
    from moebench.report import tables as rep

    if fmt == "table":
        rep.render(table, "table", title, console=out_console())
    else:
        emit(rep.render(table, fmt, "compare"))


def _gate(base_df, new_df, runs, fail_pct: float, threshold: float, fmt: str, base_count: int) -> None:
    from moebench.report.gate import gate

    result = gate(base_df, new_df, fail_pct, min_threshold=threshold)
    _show(result.table, fmt, f"gate: {runs[1]} against {runs[0]} (fail beyond {fail_pct:g}% and noise)")
    if base_count == 1 and "noise" in result.table.columns:
        note("note: the baseline is one run, so run-to-run noise is unknown; a baseline of several runs "
                     "made on more than one machine start carries it (docs/reports.md)")
    for line in result.regressions:
        note(f"regression: {line}", "red")
    if result.stale:
        note(f"stale baseline: {len(result.stale)} point(s) FASTER than {runs[0]} beyond noise, where a regression "
             "of up to that gain passes the gate; refresh the baseline (docs/reports.md)", "yellow")
        for line in result.stale:
            note(f"faster: {line}", "yellow")
    note(f"{len(result.regressions)} regression(s) in {len(result.table)} point(s)")
    sys.exit(result.exit_status)


def _compare_within(run: Path, by: str, base_variant, fmt: str, threshold: float) -> None:
    from moebench.report.variants import compare_within

    loaded = load_runs([run])
    if loaded.steps:
        from moebench.errors import UserError

        raise UserError(f"--by compares a sweep's variants; {run} is a step run, whose tables set its paths side by "
                        "side (layer_vs, e2e_vs against --vs)")
    df = loaded.rows
    table = compare_within(df, by, base_variant, min_threshold=threshold)
    _show(table, fmt, f"{run}: by {by}, against {table['base'].iloc[0]}")  # never empty: compare_within refuses


@click.command()
@click.argument("runs", nargs=-1, required=True, type=GivenPath(path_type=Path))
@click.option("--out", "out_dir", default=Path("plots"), show_default=True, type=GivenPath(path_type=Path),
              help="Folder the PNG charts are written to.")
def plot(runs, out_dir):
    """Draw PNG charts of one or more run folders: time and % of floor versus M, the gains, a tune's
    table against the defaults, the MoE share of TTFT; for CPU-interpreter runs, their check only. Step run
    folders: each step's composition (its parts' times x their counts) per path and point."""
    from moebench.report.charts import write_charts

    for path in write_charts(load_runs(runs), out_dir):
        click.echo(str(path))
