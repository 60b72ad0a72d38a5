"""``moebench trace``: the command over ``moebench.serve.trace.run_trace`` (a request stream in, a run folder and the
tables of what Triton compiled out)."""

from __future__ import annotations

from pathlib import Path

import click

from moebench.cli.console import FORMATS, GivenPath, emit, note, out_console, progress_bar
from moebench.cli.shape import one_shape, shape_options
from moebench.dtypes import DTYPE_NAMES
from moebench.errors import UserError

TABLES = ("summary", "events", "requests")
DEFAULT_REQUESTS = 1000
# The most requests one trace replays: their token counts and rows are held in memory, and a GPU replays some
# hundred requests a second.
MAX_REQUESTS = 1_000_000
# The interpreter runs a layer call in tenths of a second even on a tiny shape: fewer, smaller requests there.
INTERPRETER_REQUESTS, INTERPRETER_MAX_TOKENS = 20, 256


def _counts(dist, csv_file, requests, seed, max_tokens, interpreter) -> tuple[list[int], str]:
    """The requests' token counts and how meta.json names where they came from."""
    from moebench.serve import streams

    if csv_file is None:
        n = requests or (INTERPRETER_REQUESTS if interpreter else DEFAULT_REQUESTS)
        return streams.token_counts(dist, n, seed, max_tokens), streams.distribution_label(dist, max_tokens)
    lengths = streams.read_prompt_lengths(csv_file)
    n = requests or (INTERPRETER_REQUESTS if interpreter else len(lengths))
    if n > MAX_REQUESTS:
        raise UserError(f"--csv {csv_file} holds {n:,} requests, more than the {MAX_REQUESTS:,} a trace replays: "
                        "--requests N replays its first N")
    return [min(m, max_tokens) for m in lengths[:n]], f"csv:{csv_file} (clipped to 1..{max_tokens})"


def startup_line(meta: dict) -> str | None:
    """The start-up pass in one line (trace --warmup), or None where none ran."""
    if meta.get("startup_runs") is None:
        return None
    runs, kernels, disk = meta["startup_runs"], meta.get("startup_kernels"), meta.get("startup_from_disk")
    built = ("nothing built (interpreter)" if kernels is None else
             f"{kernels} kernels built" + ("" if disk is None else f" ({disk} from disk)"))
    failed = f", {len(meta['startup_failures'])} could not run" if meta.get("startup_failures") else ""
    return f"start-up pass: {runs} launch{'es' if runs != 1 else ''} in {meta['startup_s']:.2f} s, {built}{failed}"


def _summary_for_people(summary: dict):
    import pandas as pd

    return pd.DataFrame({"metric": list(summary), "value": list(summary.values())})


@click.command("trace")
@shape_options("A preset (see `moebench models`). [default without a GPU: tiny]")
@click.option("--dtype", default=None, help=f"{DTYPE_NAMES}. "
                                            "[default: bf16; without a GPU fp16]")
@click.option("--dist", default="lognormal", show_default=True, type=click.Choice(["lognormal", "uniform",
                                                                                    "decode-mix"]),
              help="Token counts: lognormal (median 150, sigma 1.3), uniform, or decode-mix (80% decode batches "
                   "of 1..64 tokens, the rest lognormal).")
@click.option("--csv", "csv_file", type=GivenPath(path_type=Path, dir_okay=False), default=None,
              help="Token counts from a CSV of prompt lengths (column prompt_len or tokens, else the first numeric "
                   "one), in order; in place of --dist.")
@click.option("--requests", type=click.IntRange(1, MAX_REQUESTS), default=None,
              help="Requests to replay. [default: 1000; with --csv all its rows; without a GPU 20]")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="The largest token count (larger ones are clipped). [default: 4096; without a GPU 256]")
@click.option("--seed", default=0, show_default=True, help="Seed of the token counts and the inputs.")
@click.option("--configs", "configs_dir", type=GivenPath(path_type=Path), default=None,
              help="A folder of moebench tables the config per M is read from, before $MOEBENCH_CONFIGS and the "
                   "shipped tables.")
@click.option("--cache-dir", type=GivenPath(path_type=Path, file_okay=False), default=None,
              help="Triton's on-disk cache for the replay (e.g. one `moebench warmup` filled). [default: a fresh "
                   "temporary folder, removed after: a cold start]")
@click.option("--warmup", is_flag=True,
              help="Run `moebench warmup` for the shape into the cache folder first (every launch up to the largest "
                   "request), then in the replay process run each warmed launch once before the first request, as "
                   "a server's start-up does (meta.json: startup_s, startup_kernels).")
@click.option("--specialize", is_flag=True,
              help="Replay with twins of the kernels that specialize on token counts (no do_not_specialize).")
@click.option("--out", "out_dir", default=Path("results"), show_default=True, type=GivenPath(path_type=Path),
              help="Where the run folder is created.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--table", "which", default=None, type=click.Choice(TABLES),
              help="Print only this table (csv prints one table: summary unless this says another).")
@click.option("--progress/--no-progress", default=True, help="Show progress on stderr.")
@click.option("--in-process", is_flag=True, hidden=True,
              help="Replay in this process (tests, debugging): its in-memory caches may not start empty.")
@click.option("--fresh", is_flag=True,
              help="Start a new run folder even where a stopped trace of the same request under --out could resume.")
def trace(model, hf_config, experts, hidden, intermediate, topk, tp, ep, dtype, dist, csv_file, requests,
          max_tokens, seed, configs_dir, cache_dir, warmup, specialize, out_dir, fmt, which, progress, in_process,
          fresh):
    """Replay serving traffic through the MoE layer on the triton path and count the kernel variants Triton
    compiles per request: a run folder with a row per request (cold latency, warm time, excess, compiles) and
    tables of the summary and each compile.

    The replay runs in a child process with TRITON_CACHE_DIR set before Triton starts, so it begins with no
    kernel in memory and, unless --cache-dir (or --warmup) says otherwise, an empty on-disk cache. Without a
    GPU it runs on the Triton interpreter, which compiles nothing: it checks the replay runs, on tiny shapes.

    A trace stopped part-way (Ctrl-C, SIGTERM, a kill, a crash) continues in its folder when the same command
    is run again: the requests it has are kept, the rest are replayed by a new process that starts cold again,
    so the compiles after the restart are counted too (meta.json: replay_starts, resumed).
    """
    import json

    import pandas as pd

    from moebench._interpret import interpreting
    from moebench.bench.interpreter import INTERPRETER_MAX_WEIGHTS, weight_elements
    from moebench.problem import check_seed
    from moebench.report import tables as report
    from moebench.report import trace_summary as ts
    from moebench.serve import streams
    from moebench.serve import trace as tr
    from moebench.store.resume import stop_on_sigterm
    from moebench.store.runfolder import ensure_out_dir
    from moebench.tables.lookup import check_dir

    check_seed(seed)
    if csv_file is not None and click.get_current_context().get_parameter_source("dist").name != "DEFAULT":
        raise UserError("--csv gives the token counts and --dist draws them: give one of the two")
    interpreter = interpreting()
    if model is None and hf_config is None and experts is None:
        if not interpreter:
            raise UserError("trace one shape: give --model, --hf-config, or --experts with --hidden and "
                            "--intermediate")
        model = "tiny"
    shape = one_shape(model, hf_config, experts, hidden, intermediate, topk, tp, ep, "trace")
    weights = weight_elements(shape)
    if interpreter and weights > INTERPRETER_MAX_WEIGHTS:
        raise UserError(f"without a GPU the interpreter replays tiny shapes only: {shape.name} has {weights:,} "
                        f"weight elements, more than {INTERPRETER_MAX_WEIGHTS:,}; try --model tiny")
    max_tokens = max_tokens or (INTERPRETER_MAX_TOKENS if interpreter else streams.MAX_TOKENS)
    counts, distribution = _counts(dist, csv_file, requests, seed, max_tokens, interpreter)
    check_dir(configs_dir)
    request = tr.TraceRequest(shape, dtype or ("fp16" if interpreter else "bf16"), tuple(counts), distribution,
                              seed=seed, configs_dir=None if configs_dir is None else str(configs_dir.resolve()),
                              cache_dir=None if cache_dir is None else str(cache_dir.resolve()), warmup=warmup,
                              specialize=specialize)
    tr.check_request(request)
    ensure_out_dir(out_dir)
    if interpreter:
        note(f"No CUDA GPU: {ts.INTERPRETER_NOTE}.", "yellow")
    bar = progress_bar(progress)
    # Ctrl-C or SIGTERM: the child is stopped, the folder says "interrupted" and cli.main how to resume it
    with stop_on_sigterm(), bar:
        task = bar.add_task(f"trace {shape.name} {request.dtype}", total=len(counts))

        def resumed(run_dir: Path, record: dict) -> None:
            for w in record.get("warnings", []):
                note(w)
            note(f"resuming {run_dir}: {record['rows_kept']} requests kept "
                  f"(previous status: {record['previous_status']})")
            bar.update(task, advance=record["rows_kept"])

        done = tr.run_trace(request, out_dir, in_process=in_process, resume=not fresh, on_resume=resumed,
                            on_row=lambda row: bar.update(task, advance=1, description=f"request M={row['M']}"),
                            summarize=ts.summarize)

    summary = done.meta["summary"]
    tables = {"summary": pd.DataFrame([summary]), "events": ts.events_table(done.rows),
              "requests": ts.requests_table(done.rows)}
    if fmt == "json" and which:
        emit(report.render(tables[which], "json", which))
    elif fmt == "json":
        click.echo(json.dumps({"run": str(done.run_dir), "count_method": done.meta.get("count_method"),
                               "summary": summary,
                               "events": json.loads(report.render(tables["events"], "json", "events"))}, indent=2))
    elif fmt == "csv":
        emit(report.render(tables[which or "summary"], "csv", which or "summary"))
    else:
        console, title = out_console(), f"{shape.name} {request.dtype}, {len(counts)} requests"
        for name in [which] if which else ["summary", "events"]:
            table = _summary_for_people(summary) if name == "summary" else tables[name]
            if name == "events" and table.empty and not which:
                counted = done.meta.get("count_method") != "interpreter"
                console.print("no kernel variant was built" if counted else ts.INTERPRETER_NOTE, markup=False,
                              highlight=False, soft_wrap=True)
                continue
            report.render(table, "table", f"{name}: {title}", console=console, caption="")
    if line := startup_line(done.meta):
        note(line)
    note(f"run folder: {done.run_dir}")
