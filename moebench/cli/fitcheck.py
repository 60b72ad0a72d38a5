"""``moebench fit-check`` and ``moebench fit-time``: the commands over ``audit.fitcheck`` (the fitted default
checked leave-one-shape-out on the tuned tables; the points a GPU times) and ``audit.fittime`` (those points
timed against the engines' untuned default and the tuned tables)."""

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
from moebench.errors import UserError

CHECK_COLUMNS = ("table", "experts", "intermediate", "hidden", "topk", "dtype", "M", "predicted", "source", "distance",
                 "tuned", "same", "ratio", "budget")
TIME_COLUMNS = ("model", "tp", "dtype", "M", "fitted", "fitted_from", "fitted_us", "classic", "classic_us",
                "vs_classic", "classic_verdict", "other", "other_us", "vs_other", "other_verdict", "meets", "error")


def _tables(configs_dir: Path | None):
    from moebench.tables import lookup

    tables = lookup.tuned_tables(lookup.check_dir(configs_dir))
    if not tables:
        where = ", ".join(str(folder) for _, folder in lookup.table_dirs(configs_dir))
        raise UserError(f"no moebench table to check the fit on in {where}")
    return tables


def _check_runs(runs) -> None:
    """UserError for a ``--runs`` folder that is no run folder: a typo is said, not passed over."""
    from moebench.store.runfolder import ROWS_FILE, rows_file

    for run in runs:
        if not Path(run).is_dir() or not rows_file(Path(run)).is_file():
            raise UserError(f"--runs {run}: no run folder there (a folder with {ROWS_FILE})")


@click.command("fit-check")
@click.option("--configs", "configs_dir", default=None, type=GivenPath(path_type=Path),
              help="A folder of moebench tables, read before $MOEBENCH_CONFIGS and the shipped ones.")
@click.option("--runs", "runs", multiple=True, type=GivenPath(path_type=Path),
              help="A run folder whose timings give ratios (repeatable); each table's own source run is read too.")
@click.option("--points", "points_file", default=None, type=GivenPath(path_type=Path, dir_okay=False),
              help="Also write the points a GPU times (`moebench fit-time`): every served entry at vLLM's 18 M.")
@click.option("--device-name", "--device", "device", default="NVIDIA H200", show_default=True,
              help="The device whose tables --points fits from.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
def fit_check(configs_dir, runs, points_file, device, fmt):
    """Check the fitted default leave-one-shape-out: for each tuned table, fit on the tables of its device but
    those of its shape, and predict that shape's config at each of the table's M. Prints the predicted config
    beside the table's, and their time ratio where a recorded run timed both on that shape. Without a tuned
    point near enough the prediction is the heuristic.
    """
    from moebench.audit.fitcheck import geomean, leave_one_out, points, write_points

    _check_runs(runs)
    tables = _tables(configs_dir)
    rows = [c.as_row() for c in leave_one_out(tables, runs)]
    _show_checks(rows, fmt)
    if points_file is not None:
        mine = [t for t in tables if t.device_name.replace("_", " ") == device.replace("_", " ")]
        pts = points(mine, device)
        write_points(points_file, pts, device, mine)
        note(f"{len(pts)} points for `moebench fit-time` written to {points_file}")
    same = sum(r["same"] for r in rows)
    timed = [r["ratio"] for r in rows if r["ratio"]]
    mean = geomean(timed)
    note(f"{len(rows)} held-out points: {same} predicted the table's own config; {len(timed)} with recorded times"
         + (f", predicted / tuned {mean:.3f}x (geometric mean), at most {max(timed):.3f}x" if mean else ""))


def _show_checks(rows: list[dict], fmt: str) -> None:
    import json

    if fmt == "json":
        emit(json.dumps({"rows": rows}, indent=2))
        return
    if fmt == "csv":
        import pandas as pd

        emit(pd.DataFrame(rows, columns=list(CHECK_COLUMNS)).to_csv(index=False))
        return
    from rich.table import Table

    console = out_console()
    for name in dict.fromkeys(r["table"] for r in rows):
        table = Table(title=f"{name}, held out")
        for col in ("M", "predicted", "from", "tuned", "predicted / tuned"):
            table.add_column(col, justify="right" if col in ("M", "predicted / tuned") else "left")
        for r in (r for r in rows if r["table"] == name):
            vs = "same config" if r["same"] else ("-" if r["ratio"] is None else f"{r['ratio']:.3f}x ({r['budget']})")
            table.add_row(str(r["M"]), r["predicted"], r["source"].removeprefix("fitted from "), r["tuned"], vs)
        console.print(table)


@click.command("fit-time")
@click.argument("points_file", type=GivenPath(path_type=Path, exists=True, dir_okay=False))
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Passes over each point's configs, back to back: the spread between them is noise.")
@click.option("--out", "out_dir", default=Path("results"), show_default=True, type=GivenPath(path_type=Path),
              help="Where the run folder of the timings is created.")
@GPUS_OPTION
@COMPILE_JOBS_OPTION
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--progress/--no-progress", default=True, help="Show progress on stderr.")
def fit_time(points_file, repeats, out_dir, gpus, compile_jobs, fmt, progress):
    """Time the points of `moebench fit-check --points` on this GPU: at each, the fitted default (moebench's
    kernel) against the engines' untuned default (vLLM's get_default_config, on the triton-classic path) and the
    tuned table (the heuristic where the shape has none), back to back. Exits 1 where the fitted default misses
    the goal: SLOWER than the engines' default at a point, or over 1.10x the table's time by the geometric mean
    over a tabled shape's points (the "goal" column marks each point over 1.10x too).
    """
    from moebench._interpret import interpreting
    from moebench.audit.fittime import read_points, shape_goals, time_points
    from moebench.store.runfolder import check_out_dir
    from moebench.workers.pools import Pools, check_pool_choice

    notes: list[str] = []
    pts = read_points(points_file, notes)
    if interpreting():
        raise UserError("fit-time times GPU kernels and there is no CUDA GPU here")
    check_out_dir(out_dir)
    check_pool_choice(gpus)
    for line in notes:
        note(line, "yellow")
    bar = progress_bar(progress)
    on_progress = phase_progress(bar)

    with bar, Pools(gpus, compile_jobs) as pools:
        result = time_points(pts, out_dir, pools, repeats=repeats, on_progress=on_progress)
    rows, goals = time_rows(result), [goal_row(g) for g in shape_goals(result.timings)]
    _show_times(rows, goals, fmt)
    note(f"run folder: {result.run_dir}")
    missed = [r for r in rows if not r["meets"]]
    if missed:
        note(f"{len(missed)} of {len(rows)} points over 1.10x the table or SLOWER than the engines' default, the "
             f"first: {missed[0]['model']} {missed[0]['dtype']} M={missed[0]['M']}", "yellow")
    short = [g for g in goals if not g["meets"]]
    if short:
        note(f"{len(short)} of {len(goals)} shapes miss the goal: " + "; ".join(_goal_text(g) for g in short), "red")
        raise SystemExit(1)


def goal_row(g) -> dict:
    return {"model": g.model, "tp": g.tp, "dtype": g.dtype, "points": g.points,
            "behind_classic": list(g.behind_classic), "vs_table": g.vs_table, "meets": g.meets}


def _goal_text(g: dict) -> str:
    from moebench.audit.fittime import GOAL_VS_TABLE, entry_name

    what = []
    if g["behind_classic"]:
        what.append(f"SLOWER than the engines' default at M={','.join(map(str, g['behind_classic']))}")
    if g["vs_table"] is not None and g["vs_table"] > GOAL_VS_TABLE:
        what.append(f"{g['vs_table']:.3f}x the table by the geometric mean")
    return f"{entry_name(g['model'], g['tp'])} {g['dtype']}: {', '.join(what)}"


def time_rows(result) -> list[dict]:
    from moebench.tile import short_label

    rows = []
    for t in result.timings:
        p = t.point
        rows.append({"model": p["model"], "tp": p["tp"], "dtype": p["dtype"], "M": p["M"],
                     "fitted": short_label(p["fitted"]), "fitted_from": p["fitted_from"], "fitted_us": t.us["fitted"],
                     "classic": short_label(p["classic"]), "classic_us": t.us["classic"], "vs_classic": t.vs_classic,
                     "classic_verdict": t.classic_verdict, "other": t.other, "other_us": t.us["other"],
                     "vs_other": t.vs_other, "other_verdict": t.other_verdict, "meets": t.meets,
                     "error": "; ".join(t.errors) or None})
    return rows


def _show_times(rows: list[dict], goals: list[dict], fmt: str) -> None:
    import json

    if fmt == "json":
        emit(json.dumps({"rows": rows, "shapes": goals}, indent=2))
        return
    if fmt == "csv":
        import pandas as pd

        emit(pd.DataFrame(rows, columns=list(TIME_COLUMNS)).to_csv(index=False))
        return
    from rich.table import Table

    from moebench.audit.fittime import GOAL_VS_TABLE, entry_name

    table = Table(title="the fitted default against the engines' default and the tuned table")
    for col in ("model", "dtype", "M", "fitted", "us", "vs classic", "vs table/heuristic", "goal"):
        table.add_column(col, justify="left" if col in ("model", "dtype", "fitted") else "right")
    for r in rows:
        def vs(ratio, verdict, what=""):
            return "-" if ratio is None else f"{ratio:.3f}x {verdict}{what}"

        table.add_row(r["model"], r["dtype"], str(r["M"]), r["fitted"],
                      "-" if r["fitted_us"] is None else f"{r['fitted_us']:.1f}",
                      vs(r["vs_classic"], r["classic_verdict"]),
                      vs(r["vs_other"], r["other_verdict"], "" if r["other"] == "table" else " (heuristic)"),
                      "ok" if r["meets"] else "MISSED", style="" if r["meets"] else "red")
    out_console().print(table)
    shapes = Table(title=f"per shape: never SLOWER than the engines' default, within {GOAL_VS_TABLE:.2f}x of the "
                         "table (geomean)")
    for col in ("model", "dtype", "points", "SLOWER than classic at M", "vs table (geomean)", "goal"):
        shapes.add_column(col, justify="left" if col in ("model", "dtype") else "right")
    for g in goals:
        shapes.add_row(entry_name(g["model"], g["tp"]), g["dtype"], str(g["points"]),
                       ",".join(map(str, g["behind_classic"])) or "-",
                       "-" if g["vs_table"] is None else f"{g['vs_table']:.3f}x",
                       "met" if g["meets"] else "MISSED", style="" if g["meets"] else "red")
    out_console().print(shapes)
