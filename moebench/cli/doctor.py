"""``moebench doctor``: the command over ``tables.doctor.diagnose`` (a shape, or an engine's warning line, in; a
table per engine out: the file it looks up, its places in order, the key read per M, the command that makes it)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from moebench.cli.console import GivenPath, emit, out_console
from moebench.cli.shape import one_shape, shape_options, token_counts
from moebench.dtypes import DTYPE_NAMES
from moebench.errors import UserError
from moebench.tables.formats import FORMATS

ENGINES = (*FORMATS, "all")


@click.command()
@shape_options()
@click.option("--dtype", default=None, help=f"{DTYPE_NAMES}. [default: a --hf-config's quantization_config, a "
                                            "preset's served dtype (tune-tables --list), else bf16; with --from-log, "
                                            "the file's]")
@click.option("--device-name", default=None,
              help='The GPU the engine serves on, as torch names it (e.g. "NVIDIA H200"). [default: this GPU]')
@click.option("--engine", default=None, type=click.Choice(ENGINES),
              help="Whose lookup to follow. [default: all; with --from-log, the engine that wrote the line]")
@click.option("--engine-triton", default=None, metavar="X.Y.Z",
              help="The Triton release the server runs: it names SGLang's folder, and a found table's Triton is set "
                   "against it. [default: 3.8.0, SGLang 0.5.23's, as export-configs]")
@click.option("--disable-shared-experts-fusion", "unfused", is_flag=True,
              help="SGLang: the server runs with this flag, its shared expert outside the routed layer (E, not E+1).")
@click.option("--m", "ms", default=None, help="Serving token counts, comma list. [default: vLLM's 18: 1,2,...,4096]")
@click.option("--m-weights", "m_weights", type=GivenPath(path_type=Path, dir_okay=False), default=None,
              help="A histogram of served batch token counts (as `tune --m-weights` reads): the M shown are "
                   "where its batches are (unless --m), and each engine says the share of batches whose M "
                   "reads a key tuned at another M.")
@click.option("--from-log", "log_line", default=None, metavar="LINE",
              help="An engine's \"Config file not found at ...\" warning (or the file name): answer for that file.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(("table", "json")))
def doctor(model, hf_config, experts, hidden, intermediate, topk, tp, ep, dtype, device_name, engine, engine_triton,
           unfused, ms, m_weights, log_line, fmt):
    """Which tuned config file vLLM, SGLang and moebench look up for a model on a GPU, every place each looks
    (in order) and what is there, the key each serving M reads and whether it was tuned, and the command that
    makes a missing file. Needs no GPU (--device-name names one).
    """
    from moebench.tables.doctor import Ask, diagnose, tune_flags
    from moebench.tune.traffic import keys_for, read_weights

    weights = read_weights(m_weights) if m_weights else None
    counts = keys_for(weights) if weights and ms is None else token_counts(ms)
    shape_given = model is not None or hf_config is not None or any(v is not None for v in (experts, hidden,
                                                                                             intermediate))
    flags = None
    if shape_given:
        shape = one_shape(model, hf_config, experts, hidden, intermediate, topk, tp, ep, verb="name")
        if model is not None:
            from moebench.models import get_model

            model = get_model(model).name
        flags = tune_flags(model, hf_config, experts, hidden, intermediate, topk, tp, ep)
    elif log_line is None:
        raise UserError("doctor: give a shape (--model, --hf-config, or --experts with --hidden and --intermediate) "
                        "or an engine's warning line (--from-log)")
    if log_line is None:
        device_name = device_name or this_gpu()
        engines = tuple(FORMATS) if engine in (None, "all") else (engine,)
        chosen, why = served_dtype(dtype, model, hf_config)
        notes = [f"dtype: {chosen} ({why})"]
        ask = Ask(shape.experts, shape.intermediate, device_name, chosen, counts, engine_triton, flags,
                  **_sglang_form(shape, ep, device_name, unfused))
    else:
        ask, engines, notes = _from_log(log_line, dtype, device_name, engine, engine_triton, counts,
                                        shape if shape_given else None, flags, ep, unfused)
    findings = diagnose(ask, engines)
    between = _between_keys(ask, engines, weights) if weights else {}
    if fmt == "json":
        emit(json.dumps({"notes": notes, "engines": [{**f.as_dict(), **({"between_keys": between[f.engine]}
                                                                        if f.engine in between else {})}
                                                     for f in findings]}, indent=2))
        return
    for line in notes:
        click.echo(line)
    console = out_console()
    for f in findings:
        _show(console, f)
        if f.engine in between:
            b = between[f.engine]
            click.echo(f"- under --m-weights: {b['share']:.0%} of {b['batches']:g} batches read a key tuned at "
                       f"another M" if b["share"] is not None else "- under --m-weights: no file, every batch "
                       "runs the engine's default")


def this_gpu() -> str:
    """This machine's GPU name, as torch gives it; a UserError asking for --device-name where there is none."""
    from moebench._interpret import cuda_available

    if not cuda_available():
        raise UserError('no CUDA GPU here: name the serving GPU with --device-name, e.g. --device-name "NVIDIA H200"')
    import torch

    return torch.cuda.get_device_name()


def served_dtype(dtype: str | None, model: str | None, hf_config) -> tuple[str, str]:
    """(dtype, why) doctor answers for: ``--dtype``, else the checkpoint's (a config.json's quantization_config),
    else the preset's first served dtype (``tune.served.SERVED``), else bf16."""
    if dtype is not None:
        return dtype, "--dtype"
    if hf_config is not None:
        from moebench.models import checkpoint_dtype

        found, why = checkpoint_dtype(hf_config)
        if found is not None:
            return found, f"the checkpoint's: {why}; --dtype chooses"
        return "bf16", f"{why}: answered for bf16; --dtype chooses"
    if model is not None:
        from moebench.tune.served import SERVED

        served = [s for s in SERVED if s.model == model and s.served]
        if served:
            return served[0].dtype, f"{model} is served so: {served[0].why}; --dtype chooses"
    return "bf16", "the default; --dtype chooses"


def _sglang_form(shape, ep: int, device_name: str, unfused: bool) -> dict:
    """Ask's fields for how SGLang serves ``shape``: its experts, tune flags and a note where it fuses the shared
    expert into the routed layer (or says why not)."""
    from moebench.tables.fusion import sglang_fuses

    fuses, why = sglang_fuses(shape, ep, device_name, unfused)
    if not why:
        return {}
    if not fuses:
        return {"engine_notes": {"sglang": why}}
    return {"engine_experts": {"sglang": shape.experts + 1}, "engine_flags": {"sglang": "--shared-fused"},
            "engine_notes": {"sglang": why}}


def _from_log(line, dtype, device_name, engine, engine_triton, counts, shape, flags, ep=1, unfused=False):
    """(Ask, engines, notes) for the file an engine's warning line names."""
    from moebench.tables.doctor import Ask
    from moebench.tables.engine_log import parse_log, presets_for

    logged = parse_log(line)
    notes = [f"the log names {logged.name}"]
    engines = ("vllm", "sglang") if logged.engine is None else (logged.engine,)
    if engine not in (None, "all") and engine not in engines:
        raise UserError(f"--engine {engine}: the line is not {FORMATS[engine].READER}'s warning")
    if engine not in (None, "all"):
        engines = (engine,)
    if logged.engine is None and engine in (None, "all"):
        notes.append("the line does not say which engine wrote it: vLLM's and SGLang's lookups follow")
    if device_name is not None and device_name.replace(" ", "_") != logged.device_name.replace(" ", "_"):
        raise UserError(f"--device-name {device_name!r}: the log names {logged.device_name!r}")
    chosen = logged.dtype
    if dtype is not None:
        from moebench.tables.formats import FORMATS as formats

        if not all(formats[e].file_name(logged.experts, logged.n, logged.device_name, dtype) == logged.name
                   for e in engines):
            raise UserError(f"--dtype {dtype}: the file {logged.name} is not named for it ({logged.why})")
        chosen = dtype
    notes.append(f"dtype: {chosen or 'none moebench tunes'} ({logged.why})" if dtype is None else f"dtype: {dtype}")
    if logged.down:
        notes.append("a _down file: SGLang's config for the second GEMM alone; moebench exports one file for both")
    form: dict = {}
    if shape is not None:
        fused = "sglang" in engines and (shape.experts + 1, shape.intermediate) == (logged.experts, logged.n) \
            and _sglang_form(shape, ep, logged.device_name, unfused).get("engine_experts")
        if fused:
            form = {"engine_flags": {"sglang": "--shared-fused"},
                    "engine_notes": _sglang_form(shape, ep, logged.device_name, unfused)["engine_notes"]}
        elif (shape.experts, shape.intermediate) != (logged.experts, logged.n):
            raise UserError(f"the model gives E={shape.experts},N={shape.intermediate}; the log names "
                            f"E={logged.experts},N={logged.n} (--tp/--ep?)")
    else:
        from moebench.tables.doctor import tune_flags
        from moebench.tables.engine_log import fused_presets_for

        found = presets_for(logged.experts, logged.n)
        fused = fused_presets_for(logged.experts, logged.n) if "sglang" in engines and not unfused else []
        if found:
            name, tp, ep = found[0]
            flags = tune_flags(name, tp=tp, ep=ep)
            notes.append(f"E={logged.experts},N={logged.n} is {_preset(found[0])}"
                         + (f"; also {', '.join(_preset(f) for f in found[1:])} (--model chooses)"
                            if len(found) > 1 else ""))
        elif fused:
            name, tp = fused[0]
            flags = tune_flags(name, tp=tp)
            form = {"engine_flags": {"sglang": "--shared-fused"}}
            notes.append(f"E={logged.experts},N={logged.n} is {_preset((name, tp, 1))} with its shared expert in "
                         "the routed layer, as SGLang serves it")
    names = {e: logged.name for e in engines}
    ask = Ask(logged.experts, logged.n, logged.device_name, chosen, counts,
              engine_triton or logged.engine_triton, flags, names, logged.dirs,
              "--engine-triton" if engine_triton else "the log's folder", log_used=logged.used, **form)
    return ask, engines, notes


def _preset(found: tuple[str, int, int]) -> str:
    name, tp, ep = found
    return name + (f" at --tp {tp}" if tp > 1 else "") + (f" --ep {ep}" if ep > 1 else "")


def _show(console, f) -> None:
    """One engine's finding: the places in order, the key read per M, then the notes and the command."""
    from rich.table import Table
    from rich.text import Text

    console.print(Text(f"{f.reader} looks up {f.file_name}", style="bold"), soft_wrap=True)
    places = Table()
    for col in ("#", "where", "file", "found"):
        places.add_column(col, overflow="fold")
    for i, p in enumerate(f.places, 1):
        state = ("found" if p.found else "no") if p.looked else "not looked"
        places.add_row(str(i), p.label, p.path or "-", Text(state + (f": {p.note}" if p.note else "")))
    console.print(places)
    if f.read is not None and f.picks:
        console.print(Text(f"{f.reader} reads {f.read}; per serving M, the key the nearest-M rule reads:"),
                      soft_wrap=True)
        picks = Table(show_header=False)
        picks.add_column(style="bold")
        for _ in f.picks:
            picks.add_column(justify="right")
        picks.add_row("M", *(str(p.m) for p in f.picks))
        picks.add_row("key", *(str(p.key) for p in f.picks))
        picks.add_row("tuned", *(Text("yes") if p.tuned else Text("no", style="yellow") for p in f.picks))
        console.print(picks)
    for n in f.notes:
        console.print(Text(f"- {n}"), soft_wrap=True)
    if f.command:
        console.print(Text("make it:" if f.read is None else "tune it again:", style="bold"))
        console.print(Text(f.command), soft_wrap=True)
    console.print()


def _between_keys(ask, engines, weights: dict[int, float]) -> dict[str, dict]:
    """Per engine: the share of the histogram's batches whose M reads a key tuned at another M (None: no file)."""
    from dataclasses import replace

    from moebench.tables.doctor import diagnose

    total, out = sum(weights.values()), {}
    for f in diagnose(replace(ask, ms=tuple(sorted(weights))), engines):
        off = sum(weights[p.m] for p in f.picks if not p.tuned) if f.read is not None else None
        out[f.engine] = {"batches": total, "share": None if off is None else off / total}
    return out
