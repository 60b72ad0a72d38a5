"""MoE layer shapes: published presets, Hugging Face config.json reader, TP/EP sharding.

A :class:`MoEShape` is what one GPU holds of one MoE layer, the numbers a fused
MoE kernel is benchmarked on::

    x    [M, hidden]                      # M tokens (routed to this GPU)
    w13  [experts, 2 * intermediate, hidden]   # gate and up projections, fused
    w2   [experts, hidden, intermediate]       # down projection
    topk_ids, topk_weights [M, topk]

Shared experts are recorded for information only: they are a dense MLP run
beside the routed experts, not part of the fused MoE kernel.

An :class:`EPMapShape` is one GPU's share under expert parallelism through an ``expert_map``
(``shard(..., ep_map=True)``): the GPU holds ``experts`` of them, the ids range over ``global_experts``,
every rank sees the whole batch, and a slot routed to another rank's expert adds nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from moebench.bounded import read_json
from moebench.errors import UserError, short
from moebench.filenames import why_not_part

# The largest size of each field a shape takes: past every served model by far (DeepSeek-V3: hidden 7168, 256
# experts; Mixtral: intermediate 14336; 61 layers), so a typo or a hostile file is refused before any allocation.
MAX_SIZES = {"experts": 4096, "hidden": 65536, "intermediate": 131072, "topk": 64, "moe_layers": 4096,
             "shared_experts": 64, "global_experts": 4096, "fused": 64}


@dataclass(frozen=True)
class MoEShape:
    name: str  # e.g. "mixtral-8x7b" or "deepseek-v3@tp8"
    experts: int  # E: routed experts held on this GPU
    hidden: int  # model hidden size (K of the first expert GEMM)
    intermediate: int  # per-expert intermediate size I on this GPU
    topk: int  # experts per token
    moe_layers: int = 1  # MoE layers in the model (dense layers excluded)
    shared_experts: int = 0  # published always-on shared experts (informational; not benchmarked)

    def __post_init__(self) -> None:
        why = why_not_part(self.name)  # a shape's name ends run folders' names
        if why:
            raise UserError(f"model shape name {short(self.name)} {why}")
        for f in fields(self):
            if f.name == "name":
                continue
            value = getattr(self, f.name)
            least = 0 if f.name in ("shared_experts", "global_experts") else 1
            if not _is_int(value) or value < least:
                need = "a non-negative integer" if least == 0 else "a positive integer"
                raise UserError(f"model {self.name}: {f.name} must be {need}, got {short(value)}")
            if value > MAX_SIZES[f.name]:
                raise UserError(f"model {self.name}: {f.name} {short(value)} is past the largest taken "
                                f"({MAX_SIZES[f.name]})")
        if self.topk > self.routed_experts:
            raise UserError(
                f"model {self.name}: topk ({self.topk}) must be <= experts ({self.routed_experts})"
            )

    @property
    def routed_experts(self) -> int:
        """The experts the top-k ids range over: this GPU's own (an EPMapShape's are global)."""
        return self.experts

    @property
    def mapped(self) -> bool:
        """The top-k ids are global and go through an expert_map (an EPMapShape)."""
        return self.routed_experts != self.experts


@dataclass(frozen=True)
class EPMapShape(MoEShape):
    """Rank 0's share of a layer under expert parallelism through an expert_map (vLLM without an all-to-all):
    the top-k ids range over ``global_experts``, this GPU holds ``experts`` of them (global ids 0..experts-1),
    and the map sends the other ids to -1, whose slots add nothing. A class of its own, so plain shapes keep
    their fields (and the keys built from them)."""

    global_experts: int = 0  # E: the experts the router picks from

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.global_experts <= self.experts:
            raise UserError(f"model {self.name}: global_experts ({self.global_experts}) must exceed the "
                            f"{self.experts} experts this GPU holds")

    @property
    def routed_experts(self) -> int:
        return self.global_experts


@dataclass(frozen=True)
class FusedShape(MoEShape):
    """A layer with its ``fused`` shared experts served inside the routed MoE kernel (SGLang's shared-expert
    fusion of DeepSeek-V3 and Kimi-K2, ``tables.fusion``): ``experts`` and ``topk`` count them, the router
    picks ``topk - fused`` of the first ``experts - fused``, and every token is routed to each shared one too
    (the last ids). A class of its own, so plain shapes keep their fields (and the keys built from them)."""

    fused: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if not _is_int(self.fused) or not 1 <= self.fused < min(self.topk, self.experts):
            raise UserError(f"model {self.name}: fused shared experts ({self.fused!r}) must be at least 1 and "
                            "fewer than topk and experts")


def fuse_shared(shape: MoEShape) -> FusedShape:
    """``shape`` with its shared experts served in the routed layer (E + shared experts, top-k + shared), named
    ``<name>+shared``; a shape with none is a UserError."""
    n = shape.shared_experts
    if n < 1 or shape.mapped or isinstance(shape, FusedShape):
        raise UserError(f"{shape.name}: no shared expert to fuse into the routed layer (or already fused)")
    return FusedShape(f"{shape.name}+shared", shape.experts + n, shape.hidden, shape.intermediate, shape.topk + n,
                      shape.moe_layers, n, fused=n)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The facts below are the fields of each model's config.json on Hugging Face
# (checked against copies in vLLM/SGLang/transformers-based code). The MoE
# layer count is num_hidden_layers minus the dense layers.
PRESETS: dict[str, MoEShape] = {
    s.name: s
    for s in (
        # mistralai/Mixtral-8x7B-v0.1: hidden_size 4096, intermediate_size 14336, num_local_experts 8,
        # num_experts_per_tok 2, num_hidden_layers 32 (all MoE)
        MoEShape("mixtral-8x7b", experts=8, hidden=4096, intermediate=14336, topk=2, moe_layers=32),
        # deepseek-ai/DeepSeek-V3: hidden_size 7168, moe_intermediate_size 2048, n_routed_experts 256,
        # num_experts_per_tok 8, num_hidden_layers 61, first_k_dense_replace 3, moe_layer_freq 1,
        # n_shared_experts 1
        MoEShape("deepseek-v3", experts=256, hidden=7168, intermediate=2048, topk=8, moe_layers=58,
                 shared_experts=1),
        # Qwen/Qwen3-30B-A3B: hidden_size 2048, moe_intermediate_size 768, num_experts 128,
        # num_experts_per_tok 8, num_hidden_layers 48, decoder_sparse_step 1, mlp_only_layers []
        MoEShape("qwen3-30b-a3b", experts=128, hidden=2048, intermediate=768, topk=8, moe_layers=48),
        # Qwen/Qwen3-235B-A22B: hidden_size 4096, moe_intermediate_size 1536, num_experts 128,
        # num_experts_per_tok 8, num_hidden_layers 94, decoder_sparse_step 1, mlp_only_layers []
        MoEShape("qwen3-235b-a22b", experts=128, hidden=4096, intermediate=1536, topk=8, moe_layers=94),
        # openai/gpt-oss-120b: hidden_size 2880, intermediate_size 2880, num_local_experts 128,
        # experts_per_token 4, num_hidden_layers 36 (all MoE)
        MoEShape("gpt-oss-120b", experts=128, hidden=2880, intermediate=2880, topk=4, moe_layers=36),
        # openai/gpt-oss-20b: hidden_size 2880, intermediate_size 2880, num_local_experts 32,
        # experts_per_token 4, num_hidden_layers 24 (all MoE)
        MoEShape("gpt-oss-20b", experts=32, hidden=2880, intermediate=2880, topk=4, moe_layers=24),
        # meta-llama/Llama-4-Scout-17B-16E text_config: hidden_size 5120, intermediate_size 8192,
        # num_local_experts 16, num_experts_per_tok 1, num_hidden_layers 48, interleave_moe_layer_step 1;
        # each Llama-4 MoE layer has one shared expert
        MoEShape("llama-4-scout", experts=16, hidden=5120, intermediate=8192, topk=1, moe_layers=48,
                 shared_experts=1),
        # moonshotai/Kimi-K2-Instruct: hidden_size 7168, moe_intermediate_size 2048, n_routed_experts 384,
        # num_experts_per_tok 8, num_hidden_layers 61, first_k_dense_replace 1, n_shared_experts 1
        MoEShape("kimi-k2", experts=384, hidden=7168, intermediate=2048, topk=8, moe_layers=60,
                 shared_experts=1),
        # made up: small enough for the Triton interpreter on a CPU
        MoEShape("tiny", experts=8, hidden=128, intermediate=64, topk=2, moe_layers=2),
    )
}

# Other spellings people type, after lower-casing, dropping an "org/" prefix and mapping "_" to "-".
ALIASES: dict[str, str] = {
    "mixtral": "mixtral-8x7b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mixtral-8x7b-instruct-v0.1": "mixtral-8x7b",
    "dsv3": "deepseek-v3",
    "deepseek-v3-base": "deepseek-v3",
    "deepseek-v3-0324": "deepseek-v3",
    "deepseek-r1": "deepseek-v3",  # same MoE shape as V3 (its config.json has the same fields)
    "qwen3-30b": "qwen3-30b-a3b",
    "qwen3-235b": "qwen3-235b-a22b",
    "gptoss-120b": "gpt-oss-120b",
    "gptoss-20b": "gpt-oss-20b",
    "llama4-scout": "llama-4-scout",
    "scout": "llama-4-scout",
    "llama-4-scout-17b-16e": "llama-4-scout",
    "llama-4-scout-17b-16e-instruct": "llama-4-scout",
    "kimi-k2-instruct": "kimi-k2",
    "kimi-k2-base": "kimi-k2",
    "kimi-k2-instruct-0905": "kimi-k2",
}


def model_names() -> list[str]:
    """The canonical preset names, in table order."""
    return list(PRESETS)


def explicit_shape(experts: int, hidden: int, intermediate: int, topk: int, name: str | None = None,
                   moe_layers: int = 1) -> MoEShape:
    """A shape given by its sizes (``--experts --hidden --intermediate --topk``, a spec's ``shapes``), named by them."""
    return MoEShape(name or f"custom-e{experts}-h{hidden}-i{intermediate}", experts, hidden, intermediate,
                    topk, moe_layers)


def get_model(name: str) -> MoEShape:
    """The preset called ``name`` (case-insensitive; aliases and ``org/`` prefixes accepted)."""
    key = name.strip().lower().rsplit("/", 1)[-1].replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in PRESETS:
        raise UserError(f"unknown model {short(name)}; known models: {', '.join(model_names())}")
    return PRESETS[key]


# Field spellings by family, first found wins.
# Mixtral/gpt-oss/Llama-4, DeepSeek/Kimi, Qwen
_EXPERT_FIELDS = ("num_local_experts", "n_routed_experts", "num_experts")
_TOPK_FIELDS = ("num_experts_per_tok", "experts_per_token")  # everyone, gpt-oss's own spelling
MAX_LAYERS = 4096  # a config's decoder layers, counted one by one: past any served model's (at most 128)
_INTERMEDIATE_FIELDS = ("moe_intermediate_size", "intermediate_size")  # routed expert size first


def from_hf_config(path: str | Path) -> MoEShape:
    """The MoE shape described by a Hugging Face ``config.json`` (the file, or a directory holding it)."""
    file, outer, cfg = _read_config(path)
    experts = _first(cfg, _EXPERT_FIELDS, file)
    topk = _first(cfg, _TOPK_FIELDS, file)
    if not experts or not topk:
        raise UserError(
            f"{file}: not a MoE config: looked for routed experts in {'/'.join(_EXPERT_FIELDS)} "
            f"and experts per token in {'/'.join(_TOPK_FIELDS)}"
        )
    intermediate = _first(cfg, _INTERMEDIATE_FIELDS, file)
    hidden = _require(cfg, "hidden_size", file)
    layers = _require(cfg, "num_hidden_layers", file)
    if layers > MAX_LAYERS:
        raise UserError(f"{file}: num_hidden_layers {layers} is past the largest taken ({MAX_LAYERS})")
    if intermediate is None:
        raise UserError(f"{file}: MoE config without {' or '.join(_INTERMEDIATE_FIELDS)}")

    moe_layers = _count_moe_layers(cfg, layers, file)
    if moe_layers == 0:
        raise UserError(f"{file}: the layer pattern leaves no MoE layer out of {layers}")
    shared = _shared_experts(outer, cfg, file)
    name = _config_name(outer, file)
    try:
        return MoEShape(name, experts, hidden, intermediate, topk, moe_layers, shared)
    except UserError as e:  # e.g. topk > experts: say which file it came from
        raise UserError(f"{file}: {e}") from None


def checkpoint_dtype(path: str | Path) -> tuple[str | None, str]:
    """(moebench dtype, why) of the weights a Hugging Face ``config.json`` describes: its ``quantization_config``
    (fp8 with 128x128 weight blocks, per tensor with static or dynamic activation scales, per channel), else its
    ``torch_dtype``; None where moebench tunes no such weights (int4, mxfp4, other fp8 blocks...)."""
    _, outer, cfg = _read_config(path)
    quant = cfg.get("quantization_config") or outer.get("quantization_config")
    if not isinstance(quant, dict):
        torch_dtype = cfg.get("torch_dtype") or cfg.get("dtype")
        named = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(str(torch_dtype))
        if named is None:
            return "bf16", "no quantization_config and no torch_dtype: bf16"
        return named, f"no quantization_config; torch_dtype {torch_dtype}"
    method = str(quant.get("quant_method", ""))[:40]
    if method == "fp8":
        block = quant.get("weight_block_size")
        if block is not None:
            if list(block) == [128, 128]:
                return "fp8-block128", "quantization_config: fp8, weight_block_size [128, 128]"
            return None, f"quantization_config: fp8 blocks of {str(block)[:20]}; moebench tunes 128x128 blocks"
        if quant.get("activation_scheme") == "static":
            return "fp8-tensor-static", "quantization_config: fp8 per tensor, static activation scales"
        return "fp8-tensor", "quantization_config: fp8 per tensor, dynamic activation scales"
    if method == "fbgemm_fp8":
        return "fp8-channel", "quantization_config: fbgemm_fp8 (fp8 weights per channel)"
    if method == "compressed-tensors":
        return _compressed_tensors(quant)
    return None, f"quantization_config: quant_method {method!r}; moebench tunes bf16, fp16, fp32 and fp8"


def _compressed_tensors(quant: dict) -> tuple[str | None, str]:
    """A compressed-tensors config's fp8 scheme, from its first config group's weights and input activations."""
    groups = quant.get("config_groups")
    group = next(iter(groups.values()), None) if isinstance(groups, dict) else None
    weights = group.get("weights") if isinstance(group, dict) else None
    acts = group.get("input_activations") if isinstance(group, dict) else None
    if not isinstance(weights, dict) or weights.get("type") != "float" or weights.get("num_bits") != 8:
        return None, "quantization_config: compressed-tensors weights that are not fp8"
    strategy = weights.get("strategy")
    dynamic = not isinstance(acts, dict) or acts.get("dynamic", True) is not False
    why = f"quantization_config: compressed-tensors fp8, {str(strategy)[:20]} weights"
    if strategy == "channel":
        return "fp8-channel", why
    if strategy == "tensor":
        return ("fp8-tensor" if dynamic else "fp8-tensor-static"), why + (", dynamic" if dynamic else ", static") \
            + " activation scales"
    if strategy == "block" and list(weights.get("block_structure") or []) == [128, 128]:
        return "fp8-block128", why + " of 128x128"
    return None, why + ": not a scheme moebench tunes"


def _read_config(path: str | Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """(file, the JSON object, the language model's fields: ``text_config`` merged over it where nested)."""
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    if not file.exists():
        raise UserError(f"{file}: no such file; pass a Hugging Face config.json or a directory holding one")
    outer = read_json(file, gz=False)
    if not isinstance(outer, dict):
        raise UserError(f"{file}: expected a JSON object, got {type(outer).__name__}")
    # Llama-4 (and other multimodal configs) nest the language model under text_config.
    nested = outer.get("text_config")
    return file, outer, ({**outer, **nested} if isinstance(nested, dict) else outer)


def _first(cfg: dict[str, Any], names: tuple[str, ...], file: Path) -> int | None:
    """The value of the first of ``names`` that the config sets to non-null, else None."""
    for n in names:
        if cfg.get(n) is not None:
            return _int_field(cfg, n, file)
    return None


def _require(cfg: dict[str, Any], name: str, file: Path) -> int:
    if cfg.get(name) is None:
        raise UserError(f"{file}: MoE config without {name}")
    return _int_field(cfg, name, file)


def _int_field(cfg: dict[str, Any], name: str, file: Path) -> int:
    value = cfg[name]
    if not _is_int(value) or value < 0:
        raise UserError(f"{file}: {name} must be a non-negative integer, got {short(value)}")
    return value


def _count_moe_layers(cfg: dict[str, Any], layers: int, file: Path) -> int:
    """How many of the ``layers`` decoder layers are MoE layers, by each family's rule.

    Llama-4: an explicit ``moe_layers`` list, else every ``interleave_moe_layer_step``-th layer
    (layers // step). DeepSeek/Kimi: layer i >= ``first_k_dense_replace`` with
    i % ``moe_layer_freq`` == 0. Qwen-MoE: (i + 1) % ``decoder_sparse_step`` == 0 and i not in
    ``mlp_only_layers``. A family's fields are absent elsewhere, so their defaults leave every layer MoE.
    """
    listed = cfg.get("moe_layers")
    if isinstance(listed, list):
        return len({i for i in listed if _is_int(i) and 0 <= i < layers})
    first_dense = _int_or(cfg, "first_k_dense_replace", 0, file)
    freq = _int_or(cfg, "moe_layer_freq", 1, file)
    step = _int_or(cfg, "decoder_sparse_step", 1, file) * _int_or(cfg, "interleave_moe_layer_step", 1, file)
    mlp_only = cfg.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list):
        raise UserError(f"{file}: mlp_only_layers must be a list of layer indices, got {short(mlp_only)}")
    mlp_only = {i for i in mlp_only if _is_int(i)}
    if freq < 1 or step < 1:
        raise UserError(
            f"{file}: moe_layer_freq, decoder_sparse_step and interleave_moe_layer_step must be >= 1"
        )
    return sum(
        1
        for i in range(layers)
        if i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in mlp_only
    )


def _int_or(cfg: dict[str, Any], name: str, default: int, file: Path) -> int:
    return default if cfg.get(name) is None else _int_field(cfg, name, file)


def _shared_experts(outer: dict[str, Any], cfg: dict[str, Any], file: Path) -> int:
    if cfg.get("n_shared_experts") is not None:  # DeepSeek V2/V3, Kimi-K2
        return _int_field(cfg, "n_shared_experts", file)
    if cfg.get("shared_expert_intermediate_size"):  # Qwen2-MoE: one shared expert of that size
        return 1
    model_types = {str(outer.get("model_type", "")), str(cfg.get("model_type", ""))}
    if any(t.startswith("llama4") for t in model_types) or "interleave_moe_layer_step" in cfg:
        return 1  # every Llama-4 MoE layer has one shared expert; the config has no count for it
    return 0


def _config_name(outer: dict[str, Any], file: Path) -> str:
    """``_name_or_path``'s last part, else the directory's name (or the repo of an HF cache
    snapshot), else ``model_type``; lower-cased."""
    given = outer.get("_name_or_path")
    if isinstance(given, str) and given.strip("/ "):
        return given.strip("/ ").rsplit("/", 1)[-1].lower()
    parent = file.resolve().parent
    # ~/.cache/huggingface/hub/models--Org--Name/snapshots/<hash>/config.json
    if parent.parent.name == "snapshots" and parent.parent.parent.name.startswith("models--"):
        return parent.parent.parent.name.rsplit("--", 1)[-1].lower()
    if parent.name:
        return parent.name.lower()
    return str(outer.get("model_type") or "model").lower()


def shard(shape: MoEShape, tp: int = 1, ep: int = 1, ep_map: bool = False) -> MoEShape:
    """What one GPU holds of ``shape`` under vLLM's tensor (``tp``) and expert (``ep``) parallelism.

    ``--tp N`` splits every expert's intermediate dimension N ways (w13 [E, 2I/N, hidden],
    w2 [E, hidden, I/N]); ``--ep N`` gives each GPU E/N whole experts. Under EP each token still
    picks ``topk`` experts from all of them. By default the layer is the one an all-to-all dispatch
    leaves: the local kernel sees only the tokens dispatched to this GPU's experts, M counts those
    tokens, and topk is capped at the local expert count (named ``@ep8``). With ``ep_map`` it is the
    one without a dispatch: every GPU sees the whole batch with top-k ids over all E experts, and an
    expert_map sends the ids of its E/N experts (rank 0's: global ids 0..E/N-1) to local ones and the
    rest to -1 (an ``EPMapShape``: ``global_experts`` E, topk kept; named ``@ep8map``).
    """
    for flag, n in (("--tp", tp), ("--ep", ep)):
        if not _is_int(n) or n < 1:
            raise UserError(f"{flag} must be a positive integer, got {n!r}")
    if ep_map and ep == 1:
        raise UserError("--ep-map (ep_map: true) needs --ep (ep) above 1: the expert-parallel degree whose rank 0 "
                        "it runs")
    if tp == 1 and ep == 1:
        return shape
    if shape.intermediate % tp:
        raise UserError(
            f"{shape.name}: intermediate size {shape.intermediate} is not divisible by --tp {tp}"
        )
    if shape.experts % ep:
        raise UserError(f"{shape.name}: {shape.experts} experts are not divisible by --ep {ep}")
    experts = shape.experts // ep
    suffix = (f"tp{tp}" if tp > 1 else "") + (f"ep{ep}" if ep > 1 else "") + ("map" if ep_map else "")
    name, intermediate = f"{shape.name}@{suffix}", shape.intermediate // tp
    if ep_map:
        return EPMapShape(name, experts, shape.hidden, intermediate, shape.topk, shape.moe_layers,
                          shape.shared_experts, global_experts=shape.experts)
    return replace(shape, name=name, experts=experts, intermediate=intermediate, topk=min(shape.topk, experts))
