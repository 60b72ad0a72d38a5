"""The probes' commands: ``isa`` (the matrix instructions of the triton kernels), ``profile`` (GPU time per kernel
of one layer) and ``bounds`` (how near its floor each point of a run could come); each over its module in
``moebench.probes``."""

from __future__ import annotations

from pathlib import Path

import click

from moebench.cli.console import FORMATS, GivenPath, emit, note, out_console, progress_bar
from moebench.errors import UserError


@click.command()
@click.option("--model", default="mixtral-8x7b", show_default=True, help="Preset whose shape is compiled.")
@click.option("--dtype", default="bf16", show_default=True, help="Dtype name.")
@click.option("--m", "m", default=16, show_default=True, help="Token count (picks the tile candidates).")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
def isa(model, dtype, m, fmt):
    """Count the matrix instructions (wgmma/HGMMA/QGMMA vs mma.sync/HMMA) of the triton kernels (GPU only)."""
    import pandas as pd

    from moebench.models import get_model
    from moebench.probes.isa import matrix_instructions
    from moebench.problem import Problem
    from moebench.report import tables as report
    from moebench.tune.handpicked import candidates

    problem = Problem(get_model(model), m, dtype)
    table = pd.DataFrame(matrix_instructions(problem, candidates(problem)))
    if fmt == "table":
        report.render(table, "table", f"matrix instructions: {model} {dtype} M={m}", console=out_console())
    else:
        emit(report.render(table, fmt, "isa"))


@click.command("profile")
@click.option("--model", default="mixtral-8x7b", show_default=True, help="Preset name.")
@click.option("--tp", default=1, show_default=True, help="Tensor-parallel degree.")
@click.option("--dtype", default="bf16", show_default=True, help="Dtype name.")
@click.option("--m", "m", default=16, show_default=True, help="Token count.")
@click.option("--path", "path_name", default="triton", show_default=True, help="Path to profile.")
@click.option("--config", "config_json", default=None, help='Tile config as JSON, e.g. \'{"BLOCK_SIZE_M": 16, ...}\'.')
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
def profile(model, tp, dtype, m, path_name, config_json, fmt):
    """GPU time per kernel of one MoE layer (PyTorch profiler; GPU only), at --config or, without it, the config
    a sweep runs (moebench's kernel: the tables in use, the fitted default, the heuristic)."""

    import pandas as pd

    from moebench.bounded import parse_json
    from moebench.models import get_model, shard
    from moebench.probes.profile import chosen_config, kernel_breakdown
    from moebench.problem import Problem
    from moebench.report import tables as report
    from moebench.tile import TileConfig

    given = parse_json(config_json, "--config") if config_json else None
    if given is not None and not isinstance(given, dict):
        raise UserError(f"--config is a JSON object of tile fields, not {type(given).__name__}")
    try:
        config = TileConfig.from_dict(given) if given is not None else None
    except UserError as e:  # missing or unknown fields, values out of range
        raise UserError(f"--config: {e}") from None
    problem = Problem(shard(get_model(model), tp=tp), m, dtype)
    source = "--config"
    if config is None:
        config, source = chosen_config(problem, path_name)
    table = pd.DataFrame(kernel_breakdown(problem, path_name, config))
    if fmt == "table":
        tiles = f", {config.label} ({source})" if config is not None else ""
        report.render(table, "table", f"{path_name}: {problem.shape.name} {dtype} M={m}{tiles}", console=out_console())
    else:
        emit(report.render(table, fmt, "profile"))


@click.command()
@click.argument("runs", nargs=-1, required=True, type=GivenPath(path_type=Path))
@click.option("--path", "path_name", default="triton", show_default=True,
              help="The path whose fastest correct row per point is set beside the point's bound.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--out", "out_dir", default=None, type=GivenPath(path_type=Path),
              help="Also write a run folder under this folder (meta.json with the ceilings, rows.jsonl).")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on stderr.")
def bounds(runs, path_name, fmt, out_dir, progress):
    """How near its floor each point of the RUNS (run folders from a GPU) could come on this GPU (GPU only).

    Per point (the fastest correct row of --path), after measuring this run's ceilings, it times a bare read
    of the floor's bytes and cuBLAS's two dense GEMMs of the point's shapes over all M*topk rows, each checked
    first. The bound is the slower; the table gives the layer's time (from its run) beside it, each as % of
    floor, and the layer's share of its bound (layer_of_bound: 1.0 is the layer at its bound).
    """
    import json

    from moebench.probes import bounds as probe
    from moebench.probes.bounds_measure import preflight, run_bounds
    from moebench.report import tables as report

    points, warnings = probe.load_points(runs, path_name)
    for w in warnings + [f"warning: {w}" for w in preflight(points, out_dir)]:
        note(w, "yellow")
    bar = progress_bar(progress)
    with bar:
        task = bar.add_task("measuring ceilings", total=len(points))
        rows, ceilings, run_dir = run_bounds(
            points, out_dir, on_start=lambda c: bar.update(task, description="bounds"),
            on_row=lambda r: bar.update(task, advance=1, description=probe.label(r)))
    table, summary = probe.bounds_table(rows), probe.summarize(rows)
    if fmt == "table":
        out = out_console()
        report.render(table[probe.TABLE_COLUMNS], "table", f"bounds of {', '.join(map(str, runs))}", console=out)
        for r in rows:
            if r.get("error"):
                out.print(f"not measured: {probe.label(r)}: {r['error']}", markup=False, highlight=False,
                          soft_wrap=True)
        out.print(probe.ceilings_line(ceilings.as_dict()), markup=False, highlight=False, soft_wrap=True)
        out.print(probe.summary_line(summary), markup=False, highlight=False, soft_wrap=True)
    elif fmt == "csv":
        emit(report.render(table, "csv", "bounds"))
        note(probe.summary_line(summary))
    else:
        click.echo(json.dumps({"ceilings": ceilings.as_dict(), "points": json.loads(report.render(table, "json", "")),
                               "summary": summary}, indent=2))
    if run_dir:
        note(f"run folder: {run_dir}")
