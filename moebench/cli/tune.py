"""``moebench tune`` and ``moebench export-configs``: the commands over ``moebench.tune.run.tune`` (options in, a
table of the chosen configs out) and ``tables.export.export_run`` (a run's tables where the engines read them)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from moebench.cli.console import (
    COMPILE_JOBS_OPTION,
    FORMATS,
    GPUS_OPTION,
    TEXT_FORMATS,
    GivenPath,
    emit,
    load_run_warned,
    note,
    out_console,
    phase_progress,
    progress_bar,
    records_text,
)
from moebench.cli.shape import one_shape, shape_options, token_counts
from moebench.dtypes import DTYPE_NAMES
from moebench.errors import UserError
from moebench.space.declared import SPACES
from moebench.tables.formats import FORMATS as LAYOUTS
from moebench.tune.strategies import DEFAULT as DEFAULT_STRATEGY
from moebench.tune.strategies import STRATEGIES

# each strategy's options, for --option's help: read from the dataclass each strategy declares
STRATEGY_OPTIONS = "; ".join(f"{name}: {', '.join(m.Options.__dataclass_fields__)}" for name, m in STRATEGIES.items())


def _options(pairs: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    out = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            out.append((name.strip(), int(value)))
        except ValueError:
            sep = ""
        if not sep:
            raise UserError(f"--option {pair!r}: expected NAME=INTEGER, e.g. top=16")
    return tuple(out)


def summary_rows(result) -> list[dict]:
    """One row per M: the chosen config, its time and the default's (timed back to back), the gain, the best
    known seed's time against it (moebench's kernel: the best hand-picked candidate), and the other run's choice
    where --check-against gave one."""
    rows = []
    for M in sorted(result.best):
        b, d, k = result.best[M], result.default.get(M), result.known.get(M)
        ours, theirs = result.check.get(M, (None, None))
        rows.append({
            "M": M, "config": b.config.label if b else None, "time_us": b.time_us if b else None,
            "default": d.config.label if d else None, "default_us": d.time_us if d else None,
            "gain": d.time_us / b.time_us if b and d and b.time_us and d.time_us else None,
            "known": k.config.label if k else None, "known_us": k.time_us if k else None,
            "vs_known": k.time_us / b.time_us if b and k and b.time_us and k.time_us else None,
            "check_config": theirs.config.label if theirs else None,
            "vs_check": ours.time_us / theirs.time_us if ours and theirs and ours.time_us and theirs.time_us else None,
        })
    return rows


@click.command()
@shape_options()
@click.option("--dtype", default=None, help=f"{DTYPE_NAMES}. "
                                            "[default: bf16; without a GPU fp16]")
@click.option("--path", "path_name", default="triton-classic", show_default=True,
              type=click.Choice(list(SPACES)),
              help="The kernel: triton-classic (the engines' form; its tables are what export-configs writes for "
                   "vLLM and SGLang) or triton (moebench's own).")
@click.option("--m", "ms", default=None,
              help="Token counts, comma list. [default: vLLM's 18: 1,2,4,...,3072,4096; without a GPU 1,16,64]")
@click.option("--strategy", default=DEFAULT_STRATEGY, show_default=True, type=click.Choice(list(STRATEGIES)),
              help="fast: cost-model seeds, a local search, the best few re-timed; exhaustive: every pruned config.")
@click.option("--option", "options", multiple=True, metavar="NAME=N",
              help=f"A strategy option, repeatable ({STRATEGY_OPTIONS}).")
@click.option("--no-prune", is_flag=True, help="Keep configs the pruning rules would drop (only unrunnable ones go).")
@GPUS_OPTION
@click.option("--ray", "ray_address", default=None, is_flag=False, flag_value="auto", metavar="[ADDRESS]",
              help="Run the workers on a Ray cluster (ADDRESS; alone: Ray's default). Needs moebench[ray].")
@COMPILE_JOBS_OPTION
@click.option("--check-against", type=GivenPath(path_type=Path, file_okay=False), default=None,
              help="Another tune's run folder (e.g. an exhaustive one): its choices re-timed beside this run's.")
@click.option("--seed", default=0, show_default=True, help="Input seed.")
@click.option("--routing", default="uniform", show_default=True, metavar="uniform|skewed|FILE",
              help="The routing tuned under: uniform, skewed (Zipf-like), or a .pt/.npy file of top-k expert ids "
                   "captured from a served model, one row per token (M rows drawn from it per batch).")
@click.option("--m-weights", "m_weights", type=GivenPath(path_type=Path, dir_okay=False), default=None,
              help="A histogram of served batch token counts (one count per line, or tokens,count): the table's "
                   "keys at its weighted quantiles (unless --m), and the expected time per batch under it.")
@click.option("--out", "out_dir", default=Path("results"), show_default=True, type=GivenPath(path_type=Path),
              help="Where the run folder is created.")
@click.option("--fresh", is_flag=True, help="A new run folder even where a stopped tune of the same request resumes.")
@click.option("--shared-fused", is_flag=True,
              help="The shared expert served inside the routed layer, as SGLang serves DeepSeek-V3 and Kimi-K2: E+1 "
                   "experts, top-k+1, every token routed to the shared one (its files are E=257 at TP8).")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--progress/--no-progress", default=True, help="Show progress on stderr.")
def tune(model, hf_config, experts, hidden, intermediate, topk, tp, ep, dtype, path_name, ms, strategy, options,
         no_prune, gpus, ray_address, compile_jobs, check_against, seed, routing, m_weights, out_dir, fmt, progress,
         fresh, shared_fused):
    """Tune the tile configs of one kernel for one shape and dtype over many M: a run folder with a row per
    measurement (failures included, typed) and best.json, the chosen config per M beside the untuned default.

    The same command after an interruption (Ctrl-C, SIGTERM, a kill) continues in the same folder. Export
    the tables with `moebench export-configs RUN`.
    """
    import json
    import time

    from moebench._interpret import interpreting
    from moebench.routing import ROUTINGS, captured
    from moebench.tune.run import NothingChosen, TuneRequest
    from moebench.tune.run import tune as run_tune
    from moebench.tune.traffic import keys_for, read_weights

    shape = one_shape(model, hf_config, experts, hidden, intermediate, topk, tp, ep)
    if shared_fused:
        from moebench.models import fuse_shared

        shape = fuse_shared(shape)
    interpreter = interpreting()
    weights = read_weights(m_weights) if m_weights else None
    small_ms = interpreter and ms is None and not weights  # vLLM's 18 M take hours on the interpreter
    if small_ms:
        from moebench.bench.spec import INTERPRETER_MS
    counts = INTERPRETER_MS if small_ms else keys_for(weights) if weights and ms is None else token_counts(ms)
    routing = routing if routing in ROUTINGS else captured(routing, shape.experts, shape.topk)
    short = interpreter and not options and strategy == "fast"  # the interpreter's short search
    if short:
        from moebench.tune.strategies.fast import INTERPRETER
    request = TuneRequest(shape, dtype or ("fp16" if interpreter else "bf16"), path_name, counts, strategy,
                          INTERPRETER if short else _options(options), routing=routing, seed=seed, prune=not no_prune,
                          m_weights=tuple(sorted(weights.items())) if weights else ())
    bar = progress_bar(progress)
    state = {"failures": {}, "first_error": {}, "best": {}, "started": False}
    started, phase = time.monotonic(), phase_progress(bar)

    def on_progress(what: str, done: int, total: int) -> None:
        if interpreter and not state["started"]:  # said once the request is valid and the tune starts
            note("No CUDA GPU: tuning on the Triton interpreter checks the search runs; its times are not GPU "
                 "performance.", "yellow")
            if small_ms:
                note(f"No CUDA GPU, so: M {','.join(map(str, request.ms))} in place of vLLM's 18 (the interpreter is "
                     "slow). --m chooses.", "yellow")
            if short:
                note("No CUDA GPU, so: a short search (" + " ".join(f"{k}={v}" for k, v in request.options)
                     + "). --option chooses.", "yellow")
        state["started"] = True
        phase(what, done, total, status=_status())

    def on_result(t) -> None:
        if not t.ok:
            state["failures"][t.failure] = state["failures"].get(t.failure, 0) + 1
            state["first_error"].setdefault(t.failure, f"{t.config.label} at M={t.M}: {t.error}")
        elif t.time_us is not None and t.time_us < state["best"].get(t.M, float("inf")):
            state["best"][t.M] = t.time_us

    def _status() -> str:
        best = state["best"]
        done = f"{len(best)}/{len(request.ms)} M timed"
        last = max(best) if best else None
        failed = sum(state["failures"].values())
        return f"{done}, {failed} failed" + (f", best at M={last}: {best[last]:.1f} us" if last else "")

    failed = None
    with bar:
        try:
            result = run_tune(request, out_dir, gpus=gpus, ray=True if ray_address == "auto" else ray_address,
                              compile_jobs=compile_jobs, fresh=fresh, check_against=check_against,
                              on_progress=on_progress, on_result=on_result)
        except NothingChosen as e:  # the run is recorded failed; its table is still shown
            failed, result = e, e.result
    for failure, n in sorted(state["failures"].items()):
        note(f"{n} config{'s' if n > 1 else ''} failed ({failure}); the first: {state['first_error'][failure]}")
    if result.resumed:
        for w in result.resumed.get("warnings", []):  # a torn last row cut off
            note(w)
        note(f"resumed {result.run_dir}: {result.resumed['rows_kept']} rows kept "
             f"(previous status: {result.resumed['previous_status']})")
    rows = summary_rows(result)
    if fmt == "json":
        click.echo(json.dumps({"run": str(result.run_dir), "rows": rows}, indent=2))
    elif fmt == "csv":
        import pandas as pd

        emit(pd.DataFrame(rows).to_csv(index=False))
    else:
        from rich.table import Table

        table = Table(title=f"tuned {request.path}: {shape.name} {request.dtype}")
        known = any(r["vs_known"] is not None for r in rows)
        for col in ("M", "config", "us", "default", "default us", "gain", *(("vs hand-picked",) if known else ()),
                    *(("vs check",) if result.check else ())):
            table.add_column(col, justify="left" if "config" in col or col == "default" else "right")
        for r in rows:
            cells = [str(r["M"]), r["config"] or "-", _num(r["time_us"]), r["default"] or "-",
                     _num(r["default_us"]), _num(r["gain"], "{:.2f}x")]
            if known:
                cells.append(_num(r["vs_known"], "{:.3f}x"))
            if result.check:
                cells.append(_num(r["vs_check"], "{:.3f}x"))
            table.add_row(*cells)
        out_console().print(table)
    if result.traffic:
        t = result.traffic
        note(f"under --m-weights ({t['batches']:g} batches): {t['tuned_us']:.1f} us per batch tuned, "
             f"{t['default_us']:.1f} us with the default ({t['gain']:.2f}x)")
    took = f"run folder: {result.run_dir} ({_took(result, time.monotonic() - started)})"
    if failed:  # nothing to export at that M
        note(took)
        note(f"tune failed: {failed}", "red")
        raise SystemExit(1)
    note(took if interpreter else f"{took}; export: moebench export-configs {result.run_dir}")


def _took(result, seconds: float) -> str:
    """How long the tune took: this start, and for a resumed one all its starts (meta.json's wall times)."""
    if not result.resumed:
        return f"{seconds:.0f} s"
    from moebench.store.runfolder import META_FILE, WALL, WALL_BY_START, read_meta

    meta = read_meta(result.run_dir / META_FILE)
    starts = meta.get(WALL_BY_START) or []
    return f"{seconds:.0f} s; {meta.get(WALL, 0):.0f} s over its {len(starts)} starts"


def _num(v, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


@click.command("export-configs")
@click.argument("run", type=GivenPath(path_type=Path))
@click.option("--out", "out_dir", default=Path("configs"), show_default=True, type=GivenPath(path_type=Path),
              help="Folder to write into, with moebench-export.json (provenance of each file).")
@click.option("--layout", default="vllm", show_default=True, type=click.Choice(list(LAYOUTS)),
              help="vllm: OUT/<name>.json; sglang: OUT/configs/triton_<x_y_z>/<name>.json (both from "
                   "triton-classic rows); moebench: OUT/moebench-tiles_<...>.json, moebench's kernel, every field.")
@click.option("--engine-triton", default=None, metavar="X.Y.Z",
              help="sglang: the Triton release the SGLang server runs, which names its folder "
                   "[default: 3.8.0, SGLang 0.5.23's Triton].")
@click.option("--merge-with", "shipped", default=None, type=GivenPath(path_type=Path, dir_okay=False),
              help="The engine's shipped table of the same shape: at each M both hold, both entries timed back to "
                   "back on this GPU in the table's kernel form and the faster kept (within noise: the shipped "
                   "one); the other keys of both kept. The sidecar says where each entry came from.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="--merge-with: passes over each pair of entries, back to back.")
@click.option("--runs", "runs_dir", default=Path("results"), show_default=True, type=GivenPath(path_type=Path),
              help="--merge-with: where the run folder of its timings is created.")
@click.option("--format", "fmt", default="text", show_default=True, type=click.Choice(TEXT_FORMATS),
              help="text: each file written, then the line pointing the engine at them; json: the same as an object.")
def export_configs(run, out_dir, layout, engine_triton, shipped, repeats, runs_dir, fmt):
    """Write a run's best tile config per (shape, dtype, M) where vLLM, SGLang or moebench reads it.

    The engines' files come from the engines' kernel form (path triton-classic; a tune's final re-timings
    where an M has them). Prints each file written, then the line that points the engine at them.
    """
    from moebench.tables.export import plan_export, write_export

    meta, df = load_run_warned(run)
    plan = plan_export(meta, df, out_dir, layout=layout, engine_triton=engine_triton,
                       source_run=str(Path(run).resolve()), merge_with=shipped)
    extra = _merge(plan, shipped, repeats, runs_dir) if shipped is not None else None
    done = write_export(plan, extra)
    for w in done.warnings:
        note(w)
    if fmt == "json":
        emit(json.dumps({"files": [str(p) for p in done.files], "env_line": done.env_line,
                         "warnings": list(done.warnings)}, indent=2))
        return
    for p in done.files:
        click.echo(str(p))
    if done.env_line:
        click.echo(done.env_line)


def _merge(plan, shipped: Path, repeats: int, runs_dir: Path) -> dict:
    """--merge-with: the shipped table matched, both timed, the faster kept in ``plan``; the sidecar's fields."""
    from moebench._interpret import interpreting
    from moebench.audit.merge import merge, prepare
    from moebench.store.runfolder import check_out_dir
    from moebench.workers.pools import Pools

    m = prepare(plan, shipped)
    if interpreting():
        raise UserError("--merge-with times both tables on a GPU and there is no CUDA GPU here")
    check_out_dir(runs_dir, "--runs")
    with Pools() as pools:
        merged = merge(m, plan, runs_dir, pools, repeats=repeats)
    taken = {k: v["from"] for k, v in merged.sidecar["merged_with"]["keys"].items()}
    note(f"merged with {shipped}: M={','.join(k for k, v in taken.items() if v == 'tuned') or 'none'} from the tune, "
         f"M={','.join(k for k, v in taken.items() if v == 'shipped') or 'none'} shipped; timings in {merged.run_dir}")
    return {m.file: merged.sidecar}


@click.command("tune-tables")
@click.option("--model", "models", multiple=True,
              help="Only this preset (repeatable). [default: every entry of --list]")
@click.option("--dtype", "dtypes", multiple=True, help="Only this dtype (repeatable).")
@click.option("--list", "list_only", is_flag=True,
              help="Print the entries (served shapes and dtypes, and the benchmark's unserved ones), then exit.")
@click.option("--m", "ms", default=None, help="Token counts, comma list. [default: vLLM's 18: 1,2,4,...,3072,4096]")
@click.option("--configs", "--into", "into", default=Path("configs"), show_default=True,
              type=GivenPath(path_type=Path),
              help="Folder the tables are written into, as --configs reads them (moebench/tables/shipped for the "
                   "package's own; --into is the older name).")
@click.option("--out", "out_dir", default=Path("results"), show_default=True, type=GivenPath(path_type=Path),
              help="Where the tunes' run folders are created.")
@GPUS_OPTION
@COMPILE_JOBS_OPTION
@click.option("--progress/--no-progress", default=True, help="Show progress on stderr.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS),
              help="--list: a table, or CSV or JSON of the entries.")
def tune_tables(models, dtypes, list_only, ms, into, out_dir, gpus, compile_jobs, progress, fmt):
    """Tune moebench's kernel for each preset at the TP degree and dtypes it is served in, and write the
    tables the triton path looks up (`moebench tune --path triton`, then `export-configs --layout moebench`,
    per entry). A stopped run resumes where it stopped. `--list` shows the entries and why each is served so.
    """
    import time

    from moebench._interpret import interpreting
    from moebench.tune.served import PATH, check, select
    from moebench.tune.served import tune_tables as run_all
    from moebench.tune.strategies import DEFAULT, get_strategy

    entries = select(models, dtypes)
    counts = token_counts(ms)
    if list_only and fmt != "table":
        emit(records_text([{"model": e.model, "tp": e.tp, "dtype": e.dtype, "served": e.served, "why": e.why}
                           for e in entries], fmt))
        return
    if list_only:
        from rich.table import Table

        table = Table(title="served shapes and dtypes (and the benchmark's unserved ones)")
        for col in ("model", "tp", "dtype", "why"):
            table.add_column(col)
        for e in entries:
            table.add_row(e.model, str(e.tp), e.dtype, e.why)
        out_console().print(table)
        return
    if interpreting():
        raise UserError("tune-tables times GPU kernels and there is no CUDA GPU here (--list shows the entries)")
    check(out_dir, into, gpus)  # before anything is created: each tune creates --out, each export --into
    started = time.monotonic()
    options = " ".join(f"{k}={v}" for k, v in getattr(get_strategy(DEFAULT), "PATH_DEFAULTS", {}).get(PATH, {}).items())
    note(f"{len(entries)} table(s), the {DEFAULT} strategy with {options or 'its defaults'}")

    bar, state = progress_bar(progress), {"entry": ""}
    phase = phase_progress(bar)

    def begin(i, entry) -> None:
        state["entry"] = f"[{i + 1}/{len(entries)}] {entry.name}"

    def on_progress(what: str, done: int, total: int) -> None:
        phase(f"{state['entry']}: {what}", done, total)

    def end(t) -> None:
        if t.error:
            note(f"{t.entry.name}: not tuned: {t.error}", "yellow")
        for f in t.files:
            click.echo(str(f))

    with bar:
        done = run_all(entries, out_dir, into, counts,
                       {"gpus": gpus, "compile_jobs": compile_jobs, "on_progress": on_progress},
                       on_entry=begin, on_done=end)
    tuned = sum(1 for t in done if t.files)
    note(f"{tuned} of {len(done)} table(s) written into {into} in {time.monotonic() - started:.0f} s; "
         f"use them: export MOEBENCH_CONFIGS={into.resolve()}")
    if tuned < len(done):
        raise SystemExit(1)
