"""``moebench warmup``: the command over ``moebench.serve.warmup`` (every launch the triton path makes for 1..N tokens
compiled into Triton's cache ahead of serving, a summary line out)."""

from __future__ import annotations

from pathlib import Path

import click

from moebench.cli.console import TEXT_FORMATS, GivenPath, note, progress_bar
from moebench.cli.shape import one_shape, shape_options
from moebench.dtypes import DTYPE_NAMES
from moebench.errors import UserError


def _plan(table, model, hf_config, experts, hidden, intermediate, topk, tp, ep, dtype, configs_dir, max_tokens):
    """The plan from a table file, or from one shape (a preset, a config.json, or explicit sizes) and a dtype."""
    from moebench.serve import warmup

    shape_given = any(v is not None for v in (model, hf_config, experts, hidden, intermediate, topk))
    if table is not None:
        others = [name for name, given in (("a model shape", shape_given), ("--dtype", dtype is not None),
                                           ("--configs", configs_dir is not None),
                                           ("--tp/--ep", (tp, ep) != (1, 1))) if given]
        if others:
            raise UserError(f"--table names the shape, dtype and configs: give it without {others[0]}")
        return warmup.plan_for_table(table, max_tokens)
    if [model is not None, hf_config is not None, any(v is not None for v in (experts, hidden, intermediate))
        ].count(True) != 1:
        raise UserError("warm one shape: give --table, --model, --hf-config, or --experts with --hidden and "
                        "--intermediate")
    if dtype is None:
        raise UserError("give --dtype: tables are per dtype (bf16, fp16, fp32, fp8-tensor, ...)")
    shape = one_shape(model, hf_config, experts, hidden, intermediate, topk, tp, ep, "warm")
    return warmup.plan_for_model(shape, dtype, configs_dir, max_tokens)


def summary_line(plan, report) -> str:
    """The one line on stdout: what was warmed, for which token counts, from where, how many kernels in how
    long, and where."""
    failed = f", {len(report.failures)} failed" if report.failures else ""
    configs = f"{report.configs} config{'s' if report.configs != 1 else ''}"
    return (f"warmed {configs} of {plan.name} {plan.dtype} for 1..{plan.max_tokens} tokens ({plan.source})"
            f"{failed}: "
            f"{report.kernels} kernels compiled in {report.seconds:.1f} s into {report.cache_dir}")


@click.command()
@click.option("--table", type=GivenPath(path_type=Path), default=None,
              help="A moebench table file (export-configs --layout moebench): its configs, each M at its nearest key, "
                   "on its shape.")
@shape_options()
@click.option("--dtype", default=None, help=f"{DTYPE_NAMES} (with a shape).")
@click.option("--configs", "configs_dir", type=GivenPath(path_type=Path), default=None,
              help="A folder of moebench tables looked in before $MOEBENCH_CONFIGS and the shipped tables.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Warm every launch the triton path makes for 1..N tokens (each M at the config the lookup "
                   "gives it), once per distinct launch.")
@click.option("--compile-jobs", "--jobs", "jobs", type=click.IntRange(min=0), default=None,
              help="Worker processes that compile; 0 compiles in this one. [default: cores - 1, at most 15]")
@click.option("--cache-dir", type=GivenPath(path_type=Path, file_okay=False), default=None,
              help="Triton cache folder to compile into. [default: $TRITON_CACHE_DIR, else Triton's ~/.triton/cache]")
@click.option("--format", "fmt", default="text", show_default=True, type=click.Choice(TEXT_FORMATS))
@click.option("--progress/--no-progress", default=True, help="Show progress on stderr.")
def warmup(table, model, hf_config, experts, hidden, intermediate, topk, tp, ep, dtype, configs_dir, max_tokens, jobs,
           cache_dir, fmt, progress):
    """Compile every launch the triton path makes for one shape and dtype up to --max-tokens tokens (the table its
    lookup picks, a --table file, or the heuristic) into Triton's on-disk cache, in parallel worker processes,
    so serving starts warm.

    Every M of 1..--max-tokens is run at the config the lookup gives it, once per distinct launch (config and
    launch flags); a config that cannot run is listed on stderr, not fatal.
    """
    import json

    from moebench import _interpret  # noqa: F401  (first: the interpreter on, where there is no GPU)
    from moebench.serve.warmup import warm
    from moebench.workers.pools import default_jobs

    plan = _plan(table, model, hf_config, experts, hidden, intermediate, topk, tp, ep, dtype, configs_dir,
                 max_tokens)
    for line in plan.notes:
        note(line, "yellow")
    bar = progress_bar(progress)
    with bar:
        task = bar.add_task("warmup", total=plan.runs)
        report = warm(plan, default_jobs() if jobs is None else jobs, cache_dir,
                      on_progress=lambda what, done, total: bar.update(task, completed=done, description=what))
    for line in report.failures:
        note(f"could not run: {line}")
    if report.interpreter:
        note("No CUDA GPU: the Triton interpreter compiles nothing; this was a dry run that checks each config "
             "runs.", "yellow")
    if fmt == "json":
        click.echo(json.dumps({"shape": plan.name, "dtype": plan.dtype, "source": plan.source,
                               "max_tokens": plan.max_tokens, "m": [M for M, _ in plan.items],
                               "same_launch_m": plan.dropped, **report.as_dict()}, indent=2))
    else:
        click.echo(summary_line(plan, report))
