"""The options that name one MoE shape, shared by ``tune``, ``warmup`` and ``trace``: a preset, a Hugging Face
config.json, or explicit sizes, then sharded by --tp/--ep; and the --m list of token counts."""

from __future__ import annotations

from pathlib import Path

import click

from moebench.cli.console import GivenPath
from moebench.errors import UserError


def shape_options(model_help: str = "A preset (see `moebench models`)."):
    """The decorator adding --model, --hf-config, --experts, --hidden, --intermediate, --topk, --tp, --ep."""
    options = [
        click.option("--model", default=None, help=model_help),
        click.option("--hf-config", type=GivenPath(path_type=Path), default=None, help="A Hugging Face config.json."),
        click.option("--experts", type=int, default=None, help="Explicit shape: routed experts."),
        click.option("--hidden", type=int, default=None, help="Explicit shape: hidden size."),
        click.option("--intermediate", type=int, default=None, help="Explicit shape: per-expert intermediate size."),
        click.option("--topk", type=int, default=None, help="Top-k. [default: the model's]"),
        click.option("--tp", default=1, show_default=True,
                     help="Tensor-parallel degree: divides the intermediate size."),
        click.option("--ep", default=1, show_default=True, help="Expert-parallel degree: divides the experts."),
    ]

    def apply(f):
        for option in reversed(options):
            f = option(f)
        return f

    return apply


def one_shape(model, hf_config, experts, hidden, intermediate, topk, tp, ep, verb: str = "tune"):
    """The one MoE shape a command is for: a preset, a config.json, or explicit sizes; then sharded.
    UserError (naming ``verb``, e.g. "tune one shape") unless exactly one of them is given."""
    from moebench.models import explicit_shape, from_hf_config, get_model, shard

    explicit = [v is not None for v in (experts, hidden, intermediate)]
    given = [model is not None, hf_config is not None, any(explicit)]
    if sum(given) != 1:
        raise UserError(f"{verb} one shape: give --model, --hf-config, or --experts with --hidden and --intermediate")
    if any(explicit) and not all(explicit):
        raise UserError("an explicit shape needs --experts, --hidden and --intermediate (and --topk)")
    if model is not None:
        shape = get_model(model)
    elif hf_config is not None:
        shape = from_hf_config(hf_config)
    else:
        shape = explicit_shape(experts, hidden, intermediate, topk or 2)
    if topk is not None and topk != shape.topk:
        from dataclasses import replace

        shape = replace(shape, topk=topk, name=f"{shape.name}-top{topk}")
    return shard(shape, tp=tp, ep=ep)


def token_counts(text: str | None) -> tuple[int, ...]:
    """--m as sorted distinct token counts; vLLM's tuner's 18 batch sizes where it is not given."""
    from moebench.space.declared import VLLM_MS  # loads no torch

    if text is None:
        return VLLM_MS
    try:
        ms = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        raise UserError(f"--m {text!r}: expected token counts, e.g. 1,16,128") from None
    if not ms or ms[0] < 1:
        raise UserError(f"--m {text!r}: token counts must be positive")
    return ms
