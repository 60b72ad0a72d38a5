"""``moebench sweep``: the command over ``moebench.bench.sweep.run_sweep`` (a sweep spec or flags in, a run folder
and its tables out)."""

from __future__ import annotations

from pathlib import Path

import click

from moebench.cli.console import FORMATS, GivenPath, note, note_resumed, out_console, progress_bar
from moebench.cli.report import TABLES, print_tables
from moebench.dtypes import DTYPE_NAMES


@click.command()
@click.argument("spec", required=False, type=GivenPath(dir_okay=False, path_type=Path))
@click.option("--model", "models", multiple=True,
              help="Preset name(s), repeatable or comma list (see `moebench models`).")
@click.option("--hf-config", "hf_configs", multiple=True, type=GivenPath(path_type=Path),
              help="A Hugging Face config.json (or its folder); repeatable.")
@click.option("--experts", type=int, help="Explicit shape: routed experts (with --hidden, --intermediate, --topk).")
@click.option("--hidden", type=int, help="Explicit shape: hidden size.")
@click.option("--intermediate", type=int, help="Explicit shape: per-expert intermediate size.")
@click.option("--topk", default=None, help="Top-k, comma list; overrides the models' own.")
@click.option("--m", "ms", default=None,
              help="Token counts, comma list. [default: 1,16,128,1024,4096; without a GPU 1,16,64]")
@click.option("--dtype", "dtypes", default=None,
              help=f"{DTYPE_NAMES}; comma list. "
                   "[default: bf16; without a GPU fp16]")
@click.option("--path", "paths", default=None,
              help="triton, triton-classic, cutlass, torch; comma list. "
                   "[default: triton,cutlass; with --ep-map triton; without a GPU triton,torch]")
@click.option("--routing", default=None, type=click.Choice(["uniform", "skewed"]),
              help="Expert load. [default: uniform]")
@click.option("--seed", default=None, type=int, help="Input seed. [default: 0]")
@click.option("--tp", default=1, show_default=True, help="Tensor-parallel degree: divides the intermediate size.")
@click.option("--ep", default=1, show_default=True,
              help="Expert-parallel degree: divides the experts. A rank's layer as an all-to-all dispatch leaves it: "
                   "E/N experts, top-k capped at E/N, M the tokens sent to it.")
@click.option("--ep-map", is_flag=True,
              help="With --ep N: rank 0 as vLLM runs EP without an all-to-all: all M tokens, top-k over all E "
                   "experts (global ids), its E/N experts (ids 0..E/N-1) reached through an expert_map; the other "
                   "ranks' slots add nothing. Paths without expert_map (triton-classic, cutlass) say so in the row.")
@click.option("--out", "out_dir", default=Path("results"), show_default=True, type=GivenPath(path_type=Path),
              help="Where the run folder is created.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS),
              help="Printed output.")
@click.option("--table", "which", type=click.Choice(TABLES[:2]), default=None,
              help="Print only this table (csv prints one table: throughput unless this says ttft).")
@click.option("--tune", is_flag=True,
              help="Tune each shape and dtype on the tunable paths (triton, triton-classic) with `moebench tune`'s "
                   "search over the sweep's M (its run folders beside the sweep's; a finished one is read, not run "
                   "again), then run each point with the config chosen.")
@click.option("--configs", "configs_dir", type=GivenPath(path_type=Path), default=None,
              help="A folder of moebench tables (export-configs --layout moebench) the triton path reads its tile "
                   "config from, before $MOEBENCH_CONFIGS and the shipped tables; each row says where its config "
                   "came from (config_source).")
@click.option("--compile-jobs", type=click.IntRange(min=0), default=None,
              help="With --tune: the tunes' worker processes that compile configs ahead. "
                   "[default: cores - 1, at most 15]")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on stderr.")
@click.option("--fresh", is_flag=True,
              help="Start a new run folder even where a stopped run of the same sweep under --out could resume.")
def sweep(spec, models, hf_configs, experts, hidden, intermediate, topk, ms, dtypes, paths, routing, seed, tp,
          ep, ep_map, out_dir, fmt, which, tune, configs_dir, compile_jobs, progress, fresh):
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
    from moebench.bench.interpreter import for_interpreter, interpreter_size_warning
    from moebench.bench.spec import default_spec_file, from_options
    from moebench.bench.sweep import run_sweep, validate
    from moebench.paths.base import Target
    from moebench.store.resume import stop_on_sigterm
    from moebench.store.runfolder import ensure_out_dir, load_run

    interpreter = interpreting()
    sweep_spec = from_options(
        spec, default_spec_file(interpreter), models=models, hf_configs=hf_configs, experts=experts,
        hidden=hidden, intermediate=intermediate, topk=topk, ms=ms, dtypes=dtypes, paths=paths, routing=routing,
        seed=seed, tp=tp, ep=ep, ep_map=ep_map, tune=tune,
    )
    target = Target.current()
    changed = None
    if interpreter:
        sweep_spec, changed = for_interpreter(sweep_spec, target, dtypes_given=dtypes is not None,
                                        paths_given=paths is not None, ms_given=ms is not None)
    # refuse before anything is printed or written; the plan, built once
    plan = validate(sweep_spec, target, configs_dir=configs_dir)
    ensure_out_dir(out_dir)  # an --out that is a file or read-only fails here, before any work
    out = out_console()
    if interpreter:
        note("No CUDA GPU: running on the Triton interpreter. "
             "CPU timings check correctness only; they are not GPU performance.", "yellow")
        if changed:
            note(changed, "yellow")
        if too_large := interpreter_size_warning(sweep_spec):
            note(too_large, "yellow")
    bar = progress_bar(progress)
    with stop_on_sigterm(), bar:
        task = bar.add_task("measuring ceilings" if not interpreter else "sweeping", total=None)

        def started(n: int) -> None:
            bar.update(task, total=n, description=f"sweep {sweep_spec.name}")

        def advanced(row: dict) -> None:
            bar.update(task, advance=1, description=f"{row['model']} {row['dtype']} M={row['M']} {row['path']}")

        def noted(text: str) -> None:
            bar.update(task, description=text)

        def tuning(what: str, done: int, total: int) -> None:
            bar.update(task, description=f"tune: {what}", completed=done, total=total)

        run_dir = run_sweep(plan, out_dir, on_row=advanced, on_start=started, compile_jobs=compile_jobs, on_note=noted,
                            resume=not fresh, on_resume=note_resumed, on_tune=tuning)
    _, df = load_run(run_dir)
    print_tables(df, fmt, out, which)
    note(f"run folder: {run_dir}")
