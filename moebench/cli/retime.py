"""``moebench retime``: the command over ``audit.retime`` (tables in; a table per file of each M's entry against
the default and the time it was tuned with out; exit 1 where an entry is stale)."""

from __future__ import annotations

from pathlib import Path

import click

from moebench.cli.console import (
    COMPILE_JOBS_OPTION,
    FORMATS,
    GPUS_OPTION,
    GivenPath,
    emit,
    note,
    out_console,
    phase_progress,
    progress_bar,
)
from moebench.cli.shape import one_shape, shape_options
from moebench.dtypes import DTYPE_NAMES
from moebench.errors import UserError

COLUMNS = ("file", "layout", "kernel", "model", "dtype", "M", "config", "now_us", "default", "default_us", "ratio",
           "noise", "verdict", "tuned_us", "vs_tuned", "tuned_verdict", "error")


@click.command()
@click.argument("tables", nargs=-1, required=True, type=GivenPath(path_type=Path))
@shape_options("A preset (see `moebench models`); its shard (--tp/--ep) must have the file's E and N.")
@click.option("--dtype", default=None,
              help=f"{DTYPE_NAMES}: one the file name stands for. [default: the file's; bf16 as fp16 without a GPU]")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Passes over each entry and its default, back to back: the spread between them is noise.")
@click.option("--write", is_flag=True,
              help="Replace each stale entry (slower than the default beyond the noise, or failing) by the faster "
                   "of the two configs timed, the default; the other entries are kept, the file rewritten at once.")
@click.option("--out", "out_dir", default=Path("results"), show_default=True, type=GivenPath(path_type=Path),
              help="Where the run folder of the timings is created.")
@GPUS_OPTION
@COMPILE_JOBS_OPTION
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--progress/--no-progress", default=True, help="Show progress on stderr.")
def retime(tables, model, hf_config, experts, hidden, intermediate, topk, tp, ep, dtype, repeats, write, out_dir,
           gpus, compile_jobs, fmt, progress):
    """Re-time the configs of tuned tables (vLLM, SGLang or moebench layout; a folder: every table in it) on this
    GPU under the installed Triton and torch: each M's entry against the untuned default of the table's kernel
    form, back to back, and against the time it was tuned with (the export's moebench-export.json), with
    `compare`'s noise verdict. Exits 1 where an entry is stale (SLOWER than the default, or FAILED), with
    --write or not. The hidden size is not in an engine's file name: --model, --hf-config, --hidden and --topk,
    or the export's sidecar give it.
    """
    from moebench._interpret import interpreting
    from moebench.audit.retime import check, plan
    from moebench.audit.retime import retime as run_retime
    from moebench.store.runfolder import check_out_dir
    from moebench.workers.pools import Pools

    shape, hidden_topk = _shape(model, hf_config, experts, hidden, intermediate, topk, tp, ep)
    interpreter = interpreting()
    device = None
    if not interpreter:
        from moebench.environment import device_name

        device = device_name()
    notes: list[str] = []
    planned = plan(tables, shape, hidden_topk, dtype, interpreter=interpreter, device_name=device, notes=notes)
    check(planned, write)
    check_out_dir(out_dir)
    from moebench.workers.pools import check_pool_choice

    check_pool_choice(gpus)
    for line in notes:
        note(line, "yellow")
    if interpreter:
        note("No CUDA GPU: re-timing on the Triton interpreter checks the configs run; its times are not GPU "
             "performance.", "yellow")
    bar = progress_bar(progress)
    on_progress = phase_progress(bar)

    with bar, Pools(gpus, compile_jobs) as pools:
        result = run_retime(planned, out_dir, pools, repeats=repeats, write=write, on_progress=on_progress)
    _show(result, fmt)
    note(f"run folder: {result.run_dir}")
    for path in result.written:
        note(f"refreshed {path}: its stale entries replaced by the default")
    stale = [(t, t.stale) for t in result.tables if t.stale]
    for t, ms in stale:
        note(f"stale: {t.planned.file.path} at M={','.join(map(str, ms))}: slower than the default beyond the noise "
             "(or failing)", "red")
    if stale:
        raise SystemExit(1)


def _shape(model, hf_config, experts, hidden, intermediate, topk, tp, ep):
    """(the model's shape, None) from a preset, config.json or explicit E, hidden and I; (None, (hidden, topk))
    from --hidden and --topk alone; (None, None) where no option names one."""
    if model is not None or hf_config is not None or experts is not None or intermediate is not None:
        verb = "retime at one shape"
        return one_shape(model, hf_config, experts, hidden, intermediate, topk, tp, ep, verb=verb), None
    if hidden is not None:
        if topk is None:
            raise UserError("--hidden needs --topk (E and N come from the file name)")
        return None, (hidden, topk)
    if topk is not None:
        raise UserError("--topk goes with --model, --hf-config or --hidden")
    return None, None


def _rows(result) -> list[dict]:
    rows = []
    for t in result.tables:
        p = t.planned
        for M, line in t.lines.items():
            j = line.judged
            rows.append({"file": str(p.file.path), "layout": p.file.layout, "kernel": p.file.kernel,
                         "model": p.shape.name, "dtype": p.dtype, "M": M, "config": j.a.label, "now_us": j.a_us,
                         "default": j.b.label, "default_us": j.b_us, "ratio": j.ratio, "noise": j.noise,
                         "verdict": j.verdict, "tuned_us": line.tuned_us, "vs_tuned": line.vs_tuned,
                         "tuned_verdict": line.tuned_verdict, "error": j.a_error or j.b_error})
    return rows


def _show(result, fmt: str) -> None:
    import json

    rows = _rows(result)
    if fmt == "json":
        emit(json.dumps({"run": str(result.run_dir), "rows": rows}, indent=2))
        return
    if fmt == "csv":
        import pandas as pd

        emit(pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False))
        return
    from rich.table import Table

    console = out_console()
    for t in result.tables:
        p = t.planned
        table = Table(title=f"retime {p.file.path.name}: {p.file.layout} ({p.file.kernel}), {p.shape.name} {p.dtype}")
        for col in ("M", "config", "now us", "default", "default us", "ratio", "noise", "verdict", "tuned-with us",
                    "vs tuned"):
            table.add_column(col, justify="left" if col in ("config", "default", "verdict") else "right")
        for r in (r for r in rows if r["file"] == str(p.file.path)):
            style = "red" if r["verdict"] in ("SLOWER", "FAILED") else ""
            table.add_row(str(r["M"]), r["config"], _num(r["now_us"]), r["default"], _num(r["default_us"]),
                          _num(r["ratio"], "{:.3f}x"), _num(r["noise"], "{:.1%}"), r["verdict"], _num(r["tuned_us"]),
                          "-" if r["vs_tuned"] is None else f"{r['vs_tuned']:.3f}x {r['tuned_verdict']}",
                          style=style)
        console.print(table)


def _num(v, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)
