"""``moebench step``: the command over ``moebench.step.run.run_step`` (a model's shard at --tp in, or several from a
step spec; a run folder each and the TTFT, decode and composition tables out)."""

from __future__ import annotations

from pathlib import Path

import click

from moebench._interpret import interpreting
from moebench.cli.console import FORMATS, GivenPath, NonNegative, note, note_resumed, out_console, progress_bar
from moebench.dtypes import DTYPE_NAMES
from moebench.errors import UserError
from moebench.report.steps import STEP_TABLES
from moebench.step.spec import MAX_STACK

GPU_PROMPTS, GPU_BATCHES, GPU_CONTEXT = "128,1024,4096", "1,8,64,256", 4096
CPU_PROMPTS, CPU_BATCHES, CPU_CONTEXT = "16,32", "1,4", 64  # the interpreter's: seconds, not minutes


def _ints(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected positive integers, e.g. 1,8,64") from None
    if any(v < 1 for v in values):
        raise UserError(f"{flag} {text!r}: expected positive integers")
    return values


@click.command("step")
@click.argument("spec", required=False)
@click.option("--model", default=None, help="A preset with attention facts (mixtral-8x7b, deepseek-v3, qwen3-30b-a3b, "
                                            "qwen3-235b-a22b, gpt-oss-120b, gpt-oss-20b, llama-4-scout, kimi-k2, "
                                            "tiny, tiny-mla). [default without a GPU: tiny]")
@click.option("--hf-config", type=GivenPath(path_type=Path), default=None, help="A Hugging Face config.json.")
@click.option("--tp", type=click.IntRange(min=1), default=None,
              help="Tensor-parallel degree: one GPU's shard is measured. [default: 1]")
@click.option("--ep", type=click.IntRange(min=1), default=None,
              help="Expert-parallel degree, equal to --tp: the MoE layers' experts split over the tensor-parallel "
                   "GPUs (vLLM's --enable-expert-parallel), each running every token by an expert_map. [default: 1]")
@click.option("--dtype", default=None, help=f"The MoE layer's dtype: {DTYPE_NAMES} (the other parts run in its "
                                            "activation dtype). [default: bf16; without a GPU fp16]")
@click.option("--path", "paths", default=None,
              help="MoE paths, comma-separated (triton, triton-classic, cutlass, torch). [default: triton,cutlass; "
                   "without a GPU torch]")
@click.option("--vs", default=None, help="The path the others are compared against (layer_vs, e2e_vs).")
@click.option("--prompt", "prompts", default=None,
              help=f"Prefill prompt lengths (TTFT); '' for none. [default: {GPU_PROMPTS}; without a GPU {CPU_PROMPTS}]")
@click.option("--prefill-batch", type=click.IntRange(min=1), default=None,
              help="Prompts prefilled together. [default: 1]")
@click.option("--batch", "batches", default=None,
              help=f"Decode batch sizes; '' for none. [default: {GPU_BATCHES}; without a GPU {CPU_BATCHES}]")
@click.option("--context", type=click.IntRange(min=1), default=None,
              help=f"Decode context: tokens in the KV cache. [default: {GPU_CONTEXT}; without a GPU {CPU_CONTEXT}]")
@click.option("--allreduce-gbps", type=NonNegative(), default=None,
              help="All-reduce bus bandwidth (GB/s, nccl-tests' busbw) of the modelled TP all-reduces. "
                   "[default: 450, NVLink 4: docs/step.md]")
@click.option("--allreduce-us", type=NonNegative(), default=0.0, show_default=True,
              help="Latency of each modelled all-reduce (us).")
@click.option("--stack", "stack_layers", type=click.IntRange(0, MAX_STACK), default=None,
              help="Layers of the composition check (timed whole against their parts); 0: none. [default: 4]")
@click.option("--seed", default=0, show_default=True, help="Seed of the weights and inputs.")
@click.option("--configs", "configs_dir", type=GivenPath(path_type=Path), default=None,
              help="A folder of tables: the triton path's config per M from moebench's, triton-classic's from the "
                   "engine file vLLM would look up (its shipped table or an export).")
@click.option("--tile", "tile_set", multiple=True, metavar="FIELD=VALUE",
              help="Set a field on each of the triton path's configs (as tables pick them), e.g. swap_ab=false: a "
                   "variant of the chosen configs, compared across runs (`moebench compare`).")
@click.option("--out", "out_dir", default=Path("results"), show_default=True, type=GivenPath(path_type=Path),
              help="Where the run folders are created.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--table", "which", default=None, type=click.Choice(STEP_TABLES),
              help="Print only this table (csv prints one table: ttft unless this says another).")
@click.option("--progress/--no-progress", default=True, help="Show progress on stderr.")
@click.option("--fresh", is_flag=True,
              help="Start a new run folder even where a stopped run of the same request under --out could resume.")
def step(spec, model, hf_config, tp, ep, dtype, paths, vs, prompts, prefill_batch, batches, context, allreduce_gbps,
         allreduce_us, stack_layers, seed, configs_dir, tile_set, out_dir, fmt, which, progress, fresh):
    """Measure one GPU's shard of a served model layer by layer (attention, router, the MoE layer per --path,
    shared expert, dense MLP, LM head), each checked against float32 and timed as sweeps time, and sum it over the
    model's layer counts: TTFT at --prompt lengths, decode latency and tokens/s at --batch sizes over --context,
    the MoE share of the step, and each path against --vs for the layer and end to end. Tensor parallelism's two
    all-reduces per layer are modelled from --allreduce-gbps, in their own column. SPEC (a YAML file, or a shipped
    spec's name: h200) runs several models, one run folder each; --prompt, --batch, --context, --prefill-batch
    and --stack override its points. Without a GPU it runs on the CPU (correctness only) on the tiny models."""
    from moebench.bench.interpreter import INTERPRETER_MAX_WEIGHTS, weight_elements
    from moebench.paths.base import Target
    from moebench.paths.registry import get_path
    from moebench.problem import check_seed
    from moebench.step import counts
    from moebench.step.config import StepPoint, from_hf, get_step
    from moebench.step.run import StepRequest, run_step, validate
    from moebench.step.spec import StepEntry, StepSpec, find_step_spec, load_step_spec
    from moebench.store.resume import stop_on_sigterm
    from moebench.store.runfolder import check_out_dir
    from moebench.tables.lookup import check_dir

    check_seed(seed)
    target = Target.current()
    cpu = target.device.type != "cuda"
    if spec is not None:
        given = [f for f, v in (("--model", model), ("--hf-config", hf_config), ("--tp", tp), ("--ep", ep),
                                ("--dtype", dtype), ("--path", paths), ("--vs", vs)) if v is not None]
        if given:
            raise UserError(f"{given[0]} with a step spec: the spec names each model's shard and paths")
        plan = load_step_spec(find_step_spec(spec))
    else:
        if model is not None and hf_config is not None:
            raise UserError("give --model or --hf-config, not both")
        if model is None and hf_config is None:
            if not cpu:
                raise UserError("step one model: give --model or --hf-config (or a step spec)")
            model = "tiny"
        one = StepEntry(model, hf_config, tp or 1, dtype, None if paths is None else _names(paths), vs, ep or 1)
        plan = StepSpec("flags", (one,))  # no points of its own: the flags' and the defaults'

    def pick(flag, spec_value, default):
        """The flag where given, else the spec's value where it sets one, else the default."""
        return flag if flag is not None else spec_value if spec_value is not None else default

    prompt_lengths = pick(None if prompts is None else _ints("--prompt", prompts), plan.prompts,
                          _ints("--prompt", CPU_PROMPTS if cpu else GPU_PROMPTS))
    batch_sizes = pick(None if batches is None else _ints("--batch", batches), plan.batches,
                       _ints("--batch", CPU_BATCHES if cpu else GPU_BATCHES))
    ctx = pick(context, plan.context, CPU_CONTEXT if cpu else GPU_CONTEXT)
    per_prefill = pick(prefill_batch, plan.prefill_batch, 1)
    points = tuple(StepPoint("prefill", per_prefill, p) for p in prompt_lengths)
    points += tuple(StepPoint("decode", b, ctx) for b in batch_sizes)
    gbps = counts.DEFAULT_ALLREDUCE_GBPS if allreduce_gbps is None else allreduce_gbps
    configs = None if configs_dir is None else str(check_dir(configs_dir))
    fields = _tile_fields(tile_set)

    requests = []
    for e in plan.entries:  # every entry checked before any runs: a bad one writes nothing
        cfg = get_step(e.model, e.tp, e.ep) if e.model is not None else from_hf(e.hf_config, e.tp, e.ep)
        if interpreting() and weight_elements(cfg.moe) > INTERPRETER_MAX_WEIGHTS:
            raise UserError(f"without a GPU only tiny shapes run: {cfg.name} has {weight_elements(cfg.moe):,} MoE "
                            f"weight elements, more than {INTERPRETER_MAX_WEIGHTS:,}; try --model tiny or tiny-mla")
        names = e.paths or _names("torch" if cpu else "triton,cutlass")
        for n in names:
            get_path(n)  # an unknown name: one line naming the known ones
        if fields and "triton" not in names:
            raise UserError(f"--tile sets fields of the triton path's configs; {cfg.name} runs {', '.join(names)}")
        request = StepRequest(cfg, e.dtype or ("fp16" if cpu else "bf16"), names, points, vs=e.vs,
                              allreduce_gbps=gbps, allreduce_latency_us=allreduce_us,
                              stack_layers=pick(stack_layers, plan.stack, 4), seed=seed, configs_dir=configs,
                              tile_fields=fields)
        if request.allreduce_gbps == 0 and cfg.tp > 1:
            raise UserError("--allreduce-gbps must be above 0 with --tp above 1")
        validate(request, target)
        requests.append(request)
    check_out_dir(out_dir)
    if target.interpreter:
        note("No CUDA GPU: the parts run on the CPU; their times check the composition runs, not GPU performance.",
             "yellow")
    bar = progress_bar(progress)
    done = []
    with stop_on_sigterm(), bar:
        for request in requests:
            label = f"{request.config.name} {request.dtype}"
            task = bar.add_task(f"step {label}", total=None)
            done.append((request, *run_step(
                request, out_dir, target=target, resume=not fresh, on_resume=note_resumed,
                on_row=lambda r, t=task, x=label: bar.update(t, advance=1, description=f"{x} {r['phase']} "
                                                             f"{r['batch']}x{r['length']} {r['part']}"))))
    _print(done, fmt, which)


def _tile_fields(pairs: tuple[str, ...]) -> tuple[tuple[str, object], ...]:
    """--tile FIELD=VALUE pairs as (field, value): a field of moebench's tile config, a flag's value true/false
    (on/off, 1/0), another's an integer."""
    from dataclasses import fields

    from moebench.errors import short
    from moebench.tile import TileConfig

    kinds = {f.name: f.type in ("bool", bool) for f in fields(TileConfig)}
    out = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name, text = name.strip(), text.strip().lower()
        if not sep or name not in kinds:
            raise UserError(f"--tile {short(pair)}: expected FIELD=VALUE with FIELD one of {', '.join(kinds)}")
        if kinds[name]:
            flags = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}
            if text not in flags:
                raise UserError(f"--tile {short(pair)}: {name} is true or false")
            out[name] = flags[text]
        else:
            try:
                out[name] = int(text)
            except ValueError:
                raise UserError(f"--tile {short(pair)}: {name} is an integer") from None
    return tuple(out.items())


def _names(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))


def _print(done: list, fmt: str, which: str | None) -> None:
    """The tables of each finished run ``(request, run folder, rows)``: for people one set of tables a run, for
    programs (csv, json) each table's records of all runs together."""
    import pandas as pd

    from moebench.cli.report import print_step_tables
    from moebench.report.steps import notes, step_tables

    per_run = [(run_dir, rows, step_tables(rows, request.vs)) for request, run_dir, rows in done]
    if fmt in ("json", "csv"):
        joined = {k: pd.concat([t[k] for *_, t in per_run], ignore_index=True) for k in per_run[0][2]}
        print_step_tables(joined, fmt, None, which, head={"runs": [str(r) for r, *_ in per_run]})
    else:
        for _, rows, tables in per_run:
            print_step_tables(tables, fmt, out_console(), which, notes=notes(rows))
    for run_dir, *_ in per_run:
        note(f"run folder: {run_dir}")
