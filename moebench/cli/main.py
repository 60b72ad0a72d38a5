"""The command line: thin commands that parse options and call library functions.

Errors a user can cause (``UserError``, an ``OSError`` on a path they named, a bad option) print one
line on stderr and exit with status 2. Importing this module loads neither torch nor Triton: each
command imports what it needs, so ``--help`` stays fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from moebench import __version__
from moebench.cli.report import TABLES, print_tables
from moebench.cli.report import compare as compare_command
from moebench.cli.report import plot as plot_command
from moebench.cli.report import report as report_command
from moebench.cli.trace import trace as trace_command
from moebench.cli.tune import export_configs as export_configs_command
from moebench.cli.tune import tune as tune_command
from moebench.cli.tune import tune_tables as tune_tables_command
from moebench.cli.warmup import warmup as warmup_command
from moebench.errors import UserError, os_error_line

FORMATS = ("table", "csv", "json")


def _err_console():
    """Standard error for notes, warnings and progress (rich, imported when first needed)."""
    from rich.console import Console

    return Console(stderr=True)


def _note(text: str, style: str = "") -> None:
    """One line on stderr, printed as is (no rich markup read in ``text``)."""
    from rich.text import Text

    _err_console().print(Text(text, style=style), soft_wrap=True)


def _console():
    """Standard output for tables: the terminal's width, or wide enough not to crop columns in a pipe."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def _emit(text: str | None) -> None:
    if text is not None:
        click.echo(text.rstrip("\n"))


def _progress(enabled: bool):
    """A progress bar on stderr (task, bar, done/total, elapsed); disabled, it prints nothing."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=_err_console(), disable=not enabled, transient=False)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="moebench")
def cli() -> None:
    """Benchmark and autotune fused Mixture-of-Experts kernels on Hopper GPUs."""


@cli.command()
@click.argument("spec", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--model", "models", multiple=True,
              help="Preset name(s), repeatable or comma list (see `moebench models`).")
@click.option("--hf-config", "hf_configs", multiple=True, type=click.Path(path_type=Path),
              help="A Hugging Face config.json (or its folder); repeatable.")
@click.option("--experts", type=int, help="Explicit shape: routed experts (with --hidden, --intermediate, --topk).")
@click.option("--hidden", type=int, help="Explicit shape: hidden size.")
@click.option("--intermediate", type=int, help="Explicit shape: per-expert intermediate size.")
@click.option("--topk", default=None, help="Top-k, comma list; overrides the models' own.")
@click.option("--m", "ms", default=None,
              help="Token counts, comma list. [default: 1,16,128,1024,4096; without a GPU 1,16,64]")
@click.option("--dtype", "dtypes", default=None,
              help="bf16, fp16, fp32, fp8-tensor, fp8-channel, fp8-block128; comma list. "
                   "[default: bf16; without a GPU fp16]")
@click.option("--path", "paths", default=None,
              help="triton, triton-classic, cutlass, torch; comma list. "
                   "[default: triton,cutlass; without a GPU triton,torch]")
@click.option("--routing", default=None, type=click.Choice(["uniform", "skewed"]),
              help="Expert load. [default: uniform]")
@click.option("--seed", default=None, type=int, help="Input seed. [default: 0]")
@click.option("--tp", default=1, show_default=True, help="Tensor-parallel degree: divides the intermediate size.")
@click.option("--ep", default=1, show_default=True, help="Expert-parallel degree: divides the experts.")
@click.option("--out", "out_dir", default=Path("results"), show_default=True, type=click.Path(path_type=Path),
              help="Where the run folder is created.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS),
              help="Printed output.")
@click.option("--table", "which", type=click.Choice(TABLES[:2]), default=None,
              help="Print only this table (csv prints one table: throughput unless this says ttft).")
@click.option("--tune", is_flag=True, help="Try the tile-config candidates for the triton path (a row each).")
@click.option("--configs", "configs_dir", type=click.Path(path_type=Path), default=None,
              help="A folder of moebench tables (export-configs --layout moebench) the triton path reads its tile "
                   "config from, before $MOEBENCH_CONFIGS and the shipped tables; each row says where its config "
                   "came from (config_source).")
@click.option("--compile-jobs", type=click.IntRange(min=0), default=None,
              help="With --tune on a GPU: worker processes that compile each point's candidates before it is "
                   "timed; 0 compiles them one by one in the sweep's process. [default: cores - 1, at most 12]")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on stderr.")
@click.option("--fresh", is_flag=True,
              help="Start a new run folder even where a stopped run of the same sweep under --out could resume.")
def sweep(spec, models, hf_configs, experts, hidden, intermediate, topk, ms, dtypes, paths, routing, seed, tp,
          ep, out_dir, fmt, which, tune, configs_dir, compile_jobs, progress, fresh):
    """Run a sweep from SPEC (a YAML file, or the name of a shipped spec such as quick) or from flags,
    write a run folder, print tables.

    With neither, runs the shipped quick spec on a GPU, or the cpu spec (a tiny shape on the Triton
    interpreter: correctness only, CPU timings are not GPU performance). Without a GPU, the GPU defaults
    you did not override (bf16, GPU-only paths, the GPU's M list) give way to fp16, torch and small M,
    and a line on stderr says so.

    A run stopped part-way (Ctrl-C, SIGTERM, a kill, a crash) continues in its folder when the same command
    is run again: the rows it has are kept, the rest are run.
    """
    from moebench._interpret import interpreting
    from moebench.bench.spec import default_spec_file, for_interpreter, from_options
    from moebench.bench.sweep import run_sweep, validate
    from moebench.paths.base import Target
    from moebench.store.runfolder import ensure_out_dir, load_run, stop_on_sigterm
    from moebench.workers.pools import default_jobs

    interpreter = interpreting()
    sweep_spec = from_options(
        spec, default_spec_file(interpreter), models=models, hf_configs=hf_configs, experts=experts,
        hidden=hidden, intermediate=intermediate, topk=topk, ms=ms, dtypes=dtypes, paths=paths, routing=routing,
        seed=seed, tp=tp, ep=ep, tune=tune,
    )
    target = Target.current()
    changed = None
    if interpreter:
        sweep_spec, changed = for_interpreter(sweep_spec, target, dtypes_given=dtypes is not None,
                                        paths_given=paths is not None, ms_given=ms is not None)
    # refuse before anything is printed or written; the plan, built once
    plan = validate(sweep_spec, target, configs_dir=configs_dir)
    ensure_out_dir(out_dir)  # an --out that is a file or read-only fails here, before any work
    out = _console()
    if interpreter:
        _note("No CUDA GPU: running on the Triton interpreter. "
              "CPU timings check correctness only; they are not GPU performance.", "yellow")
        if changed:
            _note(changed, "yellow")
    bar = _progress(progress)
    with stop_on_sigterm(), bar:
        task = bar.add_task("measuring ceilings" if not interpreter else "sweeping", total=None)

        def started(n: int) -> None:
            bar.update(task, total=n, description=f"sweep {sweep_spec.name}")

        def advanced(row: dict) -> None:
            bar.update(task, advance=1, description=f"{row['model']} {row['dtype']} M={row['M']} {row['path']}")

        def noted(text: str) -> None:
            bar.update(task, description=text)

        def resumed(run_dir: Path, record: dict) -> None:
            for w in record.get("warnings", []):
                _note(w)
            _note(f"resuming {run_dir}: {record['rows_kept']} rows kept (previous status: {record['previous_status']})")

        jobs = default_jobs() if compile_jobs is None else compile_jobs
        run_dir = run_sweep(plan, out_dir, on_row=advanced, on_start=started, compile_jobs=jobs, on_note=noted,
                            resume=not fresh, on_resume=resumed)
    _, df = load_run(run_dir)
    print_tables(df, fmt, out, which)
    _note(f"run folder: {run_dir}")


def _load_run_warned(run: Path, with_commit: bool = False):
    """A run folder's (meta, rows), saying on stderr when its schema version is not this moebench's or a
    torn last row was left out, and when the run did not run through (killed, interrupted, failed); with
    ``with_commit``, each row also gets its run's git commit (``commit``, from meta.json)."""
    from moebench.store.runfolder import load_run, schema_warning, status_warning

    meta, df = load_run(run)
    for w in [schema_warning(meta, str(run)), status_warning(meta, str(run), len(df)), *df.attrs.get("warnings", [])]:
        if w:
            _note(w)
    if with_commit:
        df["commit"] = meta.get("git_commit")
    return meta, df


@cli.command()
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
        report.render(table, "table", f"matrix instructions: {model} {dtype} M={m}", console=_console())
    else:
        _emit(report.render(table, fmt, "isa"))


@cli.command("profile")
@click.option("--model", default="mixtral-8x7b", show_default=True, help="Preset name.")
@click.option("--tp", default=1, show_default=True, help="Tensor-parallel degree.")
@click.option("--dtype", default="bf16", show_default=True, help="Dtype name.")
@click.option("--m", "m", default=16, show_default=True, help="Token count.")
@click.option("--path", "path_name", default="triton", show_default=True, help="Path to profile.")
@click.option("--config", "config_json", default=None, help='Tile config as JSON, e.g. \'{"BLOCK_SIZE_M": 16, ...}\'.')
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
def profile_cmd(model, tp, dtype, m, path_name, config_json, fmt):
    """GPU time per kernel of one MoE layer (PyTorch profiler; GPU only)."""
    import json

    import pandas as pd

    from moebench.models import get_model, shard
    from moebench.probes.profile import kernel_breakdown
    from moebench.problem import Problem
    from moebench.report import tables as report
    from moebench.tile import TileConfig

    try:
        given = json.loads(config_json) if config_json else None
    except json.JSONDecodeError as e:
        raise UserError(f"--config is not JSON: {e.msg}") from None
    if given is not None and not isinstance(given, dict):
        raise UserError(f"--config is a JSON object of tile fields, not {type(given).__name__}")
    try:
        config = TileConfig.from_dict(given) if given is not None else None
    except UserError as e:  # missing or unknown fields, values out of range
        raise UserError(f"--config: {e}") from None
    problem = Problem(shard(get_model(model), tp=tp), m, dtype)
    table = pd.DataFrame(kernel_breakdown(problem, path_name, config))
    if fmt == "table":
        report.render(table, "table", f"{path_name}: {problem.shape.name} {dtype} M={m}", console=_console())
    else:
        _emit(report.render(table, fmt, "profile"))


@cli.command()
def models():
    """List the model presets."""
    from moebench.models import PRESETS

    for name, s in PRESETS.items():
        click.echo(f"{name:18} experts={s.experts:<4} hidden={s.hidden:<5} intermediate={s.intermediate:<6} "
                   f"topk={s.topk} moe_layers={s.moe_layers}")


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--path", "path_name", default="triton", show_default=True,
              help="The path whose fastest correct row per point is set beside the point's bound.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--out", "out_dir", default=None, type=click.Path(path_type=Path),
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
        _note(w, "yellow")
    bar = _progress(progress)
    with bar:
        task = bar.add_task("measuring ceilings", total=len(points))
        rows, ceilings, run_dir = run_bounds(
            points, out_dir, on_start=lambda c: bar.update(task, description="bounds"),
            on_row=lambda r: bar.update(task, advance=1, description=probe.label(r)))
    table, summary = probe.bounds_table(rows), probe.summarize(rows)
    if fmt == "table":
        out = _console()
        report.render(table[probe.TABLE_COLUMNS], "table", f"bounds of {', '.join(map(str, runs))}", console=out)
        for r in rows:
            if r.get("error"):
                out.print(f"not measured: {probe.label(r)}: {r['error']}", markup=False, highlight=False,
                          soft_wrap=True)
        out.print(probe.ceilings_line(ceilings.as_dict()), markup=False, highlight=False, soft_wrap=True)
        out.print(probe.summary_line(summary), markup=False, highlight=False, soft_wrap=True)
    elif fmt == "csv":
        _emit(report.render(table, "csv", "bounds"))
        _note(probe.summary_line(summary))
    else:
        click.echo(json.dumps({"ceilings": ceilings.as_dict(), "points": json.loads(report.render(table, "json", "")),
                               "summary": summary}, indent=2))
    if run_dir:
        _note(f"run folder: {run_dir}")


cli.add_command(report_command)
cli.add_command(compare_command)
cli.add_command(plot_command)
cli.add_command(tune_command)
cli.add_command(tune_tables_command)
cli.add_command(warmup_command)
cli.add_command(trace_command)
cli.add_command(export_configs_command)


def main() -> None:
    """The ``moebench`` entry point: every error a user can cause ends here as one line and exit status 2."""
    try:
        code = cli.main(standalone_mode=False)
    except UserError as e:
        _fail(str(e))
    except click.exceptions.Abort as e:  # Ctrl-C or SIGTERM (click turns a KeyboardInterrupt into Abort)
        _stopped(e.__cause__)
        _note("aborted")
        sys.exit(130)
    except click.UsageError as e:
        where = f"; see '{e.ctx.command_path} --help'" if e.ctx is not None else ""
        _fail(f"{e.format_message().rstrip('.')}{where}", e.exit_code)
    except click.ClickException as e:
        _fail(e.format_message(), e.exit_code)
    except BrokenPipeError:  # output piped into a reader that stopped (| head): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when stdout is flushed
        sys.exit(141)
    except OSError as e:  # a path the user named: --out a file, a read-only folder, an unreadable run...
        _fail(os_error_line(e))
    sys.exit(code or 0)


def _stopped(cause: BaseException | None) -> None:
    """For a run that Ctrl-C or SIGTERM stopped (``results.Interrupted``): one line and exit 130 / 143."""
    from moebench.store.runfolder import Interrupted

    if isinstance(cause, Interrupted):
        _note(f"interrupted: rows so far in {cause.run_dir}; run the same command to resume" if cause.run_dir
              else f"interrupted ({cause.signal_name}) before a run folder was made")
        sys.exit(cause.exit_status)


def _fail(message: str, status: int = 2) -> None:
    _note(f"error: {' '.join(message.split())}")
    sys.exit(status)
