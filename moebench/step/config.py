"""One GPU's per-layer shapes of a served model beyond its MoE layer: attention, dense MLP, shared expert, LM head.

A :class:`StepConfig` is what one GPU of a ``tp``-way tensor-parallel server holds of each kind of layer::

    attention  GQA: wq [heads*head_dim, hidden], wk/wv [kv_heads*head_dim, hidden], wo [hidden, heads*head_dim]
               MLA: q_a [q_lora, hidden] (replicated), q_b [heads*(nope+rope), q_lora],
                    kv_a [kv_lora+rope, hidden] (replicated), kv_b [heads*(nope+v), kv_lora], wo [hidden, heads*v]
    router     gate [experts, hidden] (replicated)
    moe        models.MoEShape (models.shard: intermediate / tp)
    shared     w13 [2*shared_intermediate, hidden], w2 [hidden, shared_intermediate]   (0: none)
    dense MLP  w13 [2*dense_intermediate, hidden], w2 [hidden, dense_intermediate]     (dense_layers of them)
    head       norm [hidden], lm_head [vocab, hidden] (vocab-parallel: vocab / tp, rounded up)

Built from the published facts of the presets (``PRESETS``, each field's config.json source beside it) or from a
Hugging Face config.json (``from_hf``). What the form leaves out of a model's real attention (sliding windows,
chunked attention, per-head norms) is said in ``notes`` and carried into every row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from moebench.errors import UserError
from moebench.models import MoEShape, from_hf_config, get_model, shard

ATTENTION_KINDS = ("gqa", "mla")


@dataclass(frozen=True)
class Facts:
    """A model's published sizes beyond the MoE layer, whole (before sharding)."""

    moe: str  # the models.PRESETS name of its MoE layer
    layers: int  # num_hidden_layers
    attention: str  # "gqa" or "mla"
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads (MLA: heads; its cache is the latent, one per token)
    head_dim: int  # GQA: head_dim (or hidden / heads); MLA: unused, 0
    vocab: int  # vocab_size
    dense_intermediate: int = 0  # the dense layers' MLP width (intermediate_size / intermediate_size_mlp)
    shared_intermediate: int = 0  # the shared expert's width (n_shared_experts * moe_intermediate_size), 0: none
    q_lora_rank: int = 0  # MLA: q_lora_rank (0: q projected straight from hidden)
    kv_lora_rank: int = 0  # MLA: kv_lora_rank
    qk_nope_head_dim: int = 0  # MLA
    qk_rope_head_dim: int = 0  # MLA
    v_head_dim: int = 0  # MLA
    notes: tuple[str, ...] = ()  # where the modelled form differs from the model's


@dataclass(frozen=True)
class StepConfig:
    """One GPU's shapes of every kind of layer of a model under ``tp``-way tensor parallelism (``ep``: its MoE
    layers' experts split over the same GPUs instead of their intermediate size)."""

    name: str  # e.g. "deepseek-v3@tp8"
    tp: int
    moe: MoEShape  # this GPU's MoE layer (models.shard); moe.moe_layers MoE layers
    hidden: int
    layers: int  # every decoder layer
    dense_layers: int  # layers with a dense MLP in place of the MoE layer
    attention: str  # "gqa" or "mla"
    heads: int  # query heads on this GPU
    kv_heads: int  # GQA: KV heads on this GPU (replicated where the model has fewer than tp); MLA: heads
    head_dim: int  # GQA
    vocab: int  # LM-head rows on this GPU
    dense_intermediate: int  # per GPU, 0 without dense layers
    shared_intermediate: int  # per GPU, 0 without a shared expert
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    notes: tuple[str, ...] = field(default=())
    ep: int = 1

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise UserError(f"{self.name}: attention {self.attention!r} is not one of {', '.join(ATTENTION_KINDS)}")
        if self.layers != self.dense_layers + self.moe.moe_layers:
            raise UserError(f"{self.name}: {self.layers} layers is not {self.dense_layers} dense + "
                            f"{self.moe.moe_layers} MoE layers")
        if self.dense_layers and not self.dense_intermediate:
            raise UserError(f"{self.name}: {self.dense_layers} dense layers need a dense MLP size")
        if self.attention == "mla" and not (self.kv_lora_rank and self.qk_nope_head_dim and self.qk_rope_head_dim
                                            and self.v_head_dim):
            raise UserError(f"{self.name}: MLA needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim")
        if self.attention == "gqa" and not (self.head_dim and self.kv_heads and self.heads % self.kv_heads == 0):
            raise UserError(f"{self.name}: GQA needs a head_dim and query heads ({self.heads}) a multiple of KV "
                            f"heads ({self.kv_heads})")

    @property
    def qk_head_dim(self) -> int:
        """The width each query and key head is scored over: head_dim, or MLA's nope + rope."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.attention == "mla" else self.head_dim

    @property
    def kv_cache_width(self) -> int:
        """Elements one token keeps in this GPU's cache per layer: 2 * kv_heads * head_dim, or MLA's latent."""
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim


def _split(what: str, n: int, tp: int, model: str) -> int:
    if n % tp:
        raise UserError(f"{model}: {what} ({n}) is not divisible by --tp {tp}")
    return n // tp


def build(facts: Facts, moe: MoEShape, name: str, tp: int = 1, ep: int = 1) -> StepConfig:
    """One GPU's shapes of ``facts`` (with ``moe``, the whole MoE layer) under ``tp``-way tensor parallelism.

    Query heads, the dense MLP and the shared expert split ``tp`` ways (each must divide); KV heads split too,
    or, where the model has fewer than ``tp`` (and ``tp`` is a multiple of them), each GPU keeps one, as vLLM
    replicates them; the LM head's vocab splits ``tp`` ways, rounded up (vocab-parallel). With ``ep`` (equal to
    ``tp``: vLLM's ``--enable-expert-parallel`` over the tensor-parallel group) the MoE layer's experts split
    ``ep`` ways, whole: each GPU runs every token through its experts by an expert_map (``models.shard``'s
    ``ep_map``), and the all-reduce after the layer sums the GPUs' parts as under TP."""
    for flag, n in (("--tp", tp), ("--ep", ep)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise UserError(f"{flag} must be a positive integer, got {n!r}")
    if ep > 1 and ep != tp:
        raise UserError(f"{name}: --ep {ep} with --tp {tp}: the step models expert parallelism over the "
                        "tensor-parallel group (vLLM's --enable-expert-parallel), so --ep equals --tp")
    heads = _split("attention heads", facts.heads, tp, name)
    if facts.attention == "mla":
        kv_heads = heads
    elif facts.kv_heads >= tp:
        kv_heads = _split("KV heads", facts.kv_heads, tp, name)
    elif tp % facts.kv_heads:
        raise UserError(f"{name}: --tp {tp} is neither a divisor nor a multiple of its {facts.kv_heads} KV heads")
    else:
        kv_heads = 1
    dense = _split("dense MLP intermediate size", facts.dense_intermediate, tp, name)
    shared = _split("shared expert intermediate size", facts.shared_intermediate, tp, name)
    dense_layers = facts.layers - moe.moe_layers
    if dense_layers < 0:
        raise UserError(f"{name}: {moe.moe_layers} MoE layers exceed its {facts.layers} layers")
    suffix = (f"@tp{tp}" if tp > 1 else "") + (f"ep{ep}" if ep > 1 else "")
    return StepConfig(
        name=name + suffix, tp=tp, ep=ep, moe=shard(moe, ep=ep, ep_map=True) if ep > 1 else shard(moe, tp=tp),
        hidden=moe.hidden, layers=facts.layers,
        dense_layers=dense_layers, attention=facts.attention, heads=heads, kv_heads=kv_heads,
        head_dim=facts.head_dim, vocab=-(-facts.vocab // tp), dense_intermediate=dense, shared_intermediate=shared,
        q_lora_rank=facts.q_lora_rank, kv_lora_rank=facts.kv_lora_rank, qk_nope_head_dim=facts.qk_nope_head_dim,
        qk_rope_head_dim=facts.qk_rope_head_dim, v_head_dim=facts.v_head_dim, notes=facts.notes)


_DEEPSEEK_MLA = dict(attention="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                     v_head_dim=128, head_dim=0)
_ROUTER_NOTE = "router modelled as softmax top-k (the model's sigmoid, grouped top-k with bias is not run)"

# The published config.json fields of each preset beyond its MoE layer (models.PRESETS holds that).
FACTS: dict[str, Facts] = {
    # mistralai/Mixtral-8x7B-v0.1: num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8,
    # head_dim 128 (hidden_size / heads), vocab_size 32000; sliding_window null
    "mixtral-8x7b": Facts("mixtral-8x7b", 32, "gqa", 32, 8, 128, 32000),
    # deepseek-ai/DeepSeek-V3: num_hidden_layers 61, first_k_dense_replace 3, num_attention_heads 128,
    # q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128,
    # vocab_size 129280, intermediate_size 18432 (dense layers), n_shared_experts 1 x moe_intermediate_size 2048
    "deepseek-v3": Facts("deepseek-v3", 61, heads=128, kv_heads=128, vocab=129280, dense_intermediate=18432,
                         shared_intermediate=2048, notes=(_ROUTER_NOTE,), **_DEEPSEEK_MLA),
    # Qwen/Qwen3-30B-A3B: num_hidden_layers 48, num_attention_heads 32, num_key_value_heads 4, head_dim 128,
    # vocab_size 151936; no shared expert, mlp_only_layers []
    "qwen3-30b-a3b": Facts("qwen3-30b-a3b", 48, "gqa", 32, 4, 128, 151936,
                           notes=("q/k per-head RMSNorm not run",)),
    # Qwen/Qwen3-235B-A22B: num_hidden_layers 94, num_attention_heads 64, num_key_value_heads 4, head_dim 128,
    # vocab_size 151936
    "qwen3-235b-a22b": Facts("qwen3-235b-a22b", 94, "gqa", 64, 4, 128, 151936,
                             notes=("q/k per-head RMSNorm not run",)),
    # openai/gpt-oss-120b: num_hidden_layers 36, num_attention_heads 64, num_key_value_heads 8, head_dim 64,
    # vocab_size 201088; layer_types alternate sliding_attention (window 128) and full_attention; attention sinks
    "gpt-oss-120b": Facts("gpt-oss-120b", 36, "gqa", 64, 8, 64, 201088,
                          notes=("attention modelled as full on every layer (half use a 128-token sliding window); "
                                 "attention sinks not run",)),
    # openai/gpt-oss-20b: num_hidden_layers 24, num_attention_heads 64, num_key_value_heads 8, head_dim 64,
    # vocab_size 201088; sliding window on half the layers as 120b
    "gpt-oss-20b": Facts("gpt-oss-20b", 24, "gqa", 64, 8, 64, 201088,
                         notes=("attention modelled as full on every layer (half use a 128-token sliding window); "
                                "attention sinks not run",)),
    # meta-llama/Llama-4-Scout-17B-16E text_config: num_hidden_layers 48, num_attention_heads 40,
    # num_key_value_heads 8, head_dim 128, vocab_size 202048, one shared expert of intermediate_size 8192
    # (interleave_moe_layer_step 1: every layer MoE); attention_chunk_size 8192, no_rope_layers every 4th
    "llama-4-scout": Facts("llama-4-scout", 48, "gqa", 40, 8, 128, 202048, shared_intermediate=8192,
                           notes=("attention modelled as full with rotary embedding on every layer (3 of 4 are "
                                  "chunked to 8192 tokens, every 4th has no rotary embedding)",)),
    # moonshotai/Kimi-K2-Instruct: num_hidden_layers 61, first_k_dense_replace 1, num_attention_heads 64,
    # q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128,
    # vocab_size 163840, intermediate_size 18432, n_shared_experts 1 x moe_intermediate_size 2048
    "kimi-k2": Facts("kimi-k2", 61, heads=64, kv_heads=64, vocab=163840, dense_intermediate=18432,
                     shared_intermediate=2048, notes=(_ROUTER_NOTE,), **_DEEPSEEK_MLA),
    # made up: models' tiny MoE layer (2 MoE layers) after one dense layer, GQA, small enough for the CPU
    "tiny": Facts("tiny", 3, "gqa", 4, 2, 32, 512, dense_intermediate=256),
    # made up: the same layer with MLA attention and a shared expert, DeepSeek's form at CPU size
    "tiny-mla": Facts("tiny", 3, "mla", 4, 4, 0, 512, dense_intermediate=256, shared_intermediate=64,
                      q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16),
}


def step_names() -> list[str]:
    return list(FACTS)


def get_step(name: str, tp: int = 1, ep: int = 1) -> StepConfig:
    """The preset called ``name`` (models' spellings and aliases accepted) at ``tp``-way tensor parallelism
    (``ep``: ``build``'s expert parallelism)."""
    key = name.strip().lower()
    if key not in FACTS:
        key = get_model(name).name  # models' aliases, and its one-line refusal of an unknown name
    if key not in FACTS:
        raise UserError(f"model {name!r} has no attention facts; known: {', '.join(FACTS)}")
    facts = FACTS[key]
    moe = get_model(facts.moe)
    if moe.shared_experts and not facts.shared_intermediate:
        raise UserError(f"{key}: its MoE layer has shared experts but no shared expert size")
    return build(facts, moe, key, tp, ep)


# ---- Hugging Face config.json ------------------------------------------------------------------------------------

def from_hf(path: str | Path, tp: int = 1, ep: int = 1) -> StepConfig:
    """The shapes a Hugging Face ``config.json`` (the file, or a directory holding it) describes, at ``tp``: its MoE
    layer as ``models.from_hf_config`` reads it, the rest by ``from_hf_fields``."""
    file = Path(path)
    file = file / "config.json" if file.is_dir() else file
    moe = from_hf_config(file)  # the one-line refusals of a missing, unreadable or non-MoE file
    outer = json.loads(file.read_bytes())
    return from_hf_fields(outer, moe, tp, str(file), ep)


def from_hf_fields(outer: dict[str, Any], moe: MoEShape, tp: int = 1, where: str = "config.json",
                   ep: int = 1) -> StepConfig:
    """The shapes the fields of a config.json dict (``outer``; Llama-4's ``text_config`` merged in) give beside its
    MoE layer ``moe`` (what ``models.from_hf_config`` reads from the same file). UserError, one line naming the
    field, where one is missing or of a form not modelled."""
    nested = outer.get("text_config")
    cfg: dict[str, Any] = {**outer, **nested} if isinstance(nested, dict) else outer

    def need(name: str) -> int:
        value = cfg.get(name)
        if value is None:
            raise UserError(f"{where}: no {name}: cannot model the attention and LM head without it")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"{where}: {name} must be a positive integer, got {value!r}")
        return value

    def have(name: str) -> int:
        return need(name) if cfg.get(name) is not None else 0

    heads, vocab = need("num_attention_heads"), need("vocab_size")
    layers = need("num_hidden_layers")
    notes: list[str] = []
    if cfg.get("kv_lora_rank") is not None:
        attn = dict(attention="mla", kv_heads=heads, head_dim=0, q_lora_rank=have("q_lora_rank"),
                    kv_lora_rank=need("kv_lora_rank"), qk_nope_head_dim=need("qk_nope_head_dim"),
                    qk_rope_head_dim=need("qk_rope_head_dim"), v_head_dim=need("v_head_dim"))
    else:
        kv = have("num_key_value_heads") or heads
        head_dim = have("head_dim") or moe.hidden // heads
        attn = dict(attention="gqa", kv_heads=kv, head_dim=head_dim)
    if isinstance(cfg.get("layer_types"), list) and "sliding_attention" in cfg["layer_types"]:
        notes.append("attention modelled as full on every layer (layer_types has sliding_attention)")
    if cfg.get("attention_chunk_size"):
        notes.append("attention modelled as full (attention_chunk_size is not run)")
    if str(cfg.get("scoring_func", "softmax")) != "softmax" or cfg.get("n_group"):
        notes.append(_ROUTER_NOTE)
    dense_layers = layers - moe.moe_layers
    # The dense MLP: Llama-4's intermediate_size_mlp, else intermediate_size where the experts have their own size.
    dense = have("intermediate_size_mlp") or (have("intermediate_size") if cfg.get("moe_intermediate_size") else 0)
    if dense_layers and not dense:
        raise UserError(f"{where}: {dense_layers} dense layers but no intermediate_size (or intermediate_size_mlp) "
                        "for their MLP beside the experts' moe_intermediate_size")
    shared = 0
    if moe.shared_experts:
        if cfg.get("shared_expert_intermediate_size"):  # Qwen2-MoE
            shared = need("shared_expert_intermediate_size")
        else:  # DeepSeek/Kimi: n_shared_experts of the experts' size; Llama-4: one of intermediate_size
            shared = moe.shared_experts * moe.intermediate
    facts = Facts(moe.name, layers, heads=heads, vocab=vocab, dense_intermediate=dense if dense_layers else 0,
                  shared_intermediate=shared, notes=tuple(notes), **attn)
    try:
        return build(facts, moe, moe.name, tp, ep)
    except UserError as e:
        raise UserError(f"{where}: {e}") from None


def with_layers(config: StepConfig, moe_layers: int, dense_layers: int) -> StepConfig:
    """``config`` with other layer counts (tests, stacks): the shapes unchanged."""
    return replace(config, moe=replace(config.moe, moe_layers=moe_layers), layers=moe_layers + dense_layers,
                   dense_layers=dense_layers)


# ---- the token geometry of one step ------------------------------------------------------------------------------

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class StepPoint:
    """One forward step: ``batch`` prompts of ``length`` tokens prefilled together (causal), or one new token for
    each of ``batch`` sequences decoded over a cache of ``length`` tokens (the new one included)."""

    phase: str
    batch: int
    length: int  # prefill: prompt tokens; decode: context tokens in the KV cache

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise UserError(f"phase {self.phase!r} is not one of {', '.join(PHASES)}")
        for what, n in (("batch", self.batch), ("length", self.length)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise UserError(f"{self.phase} {what} must be a positive integer, got {n!r}")

    @property
    def tokens(self) -> int:
        """M: the rows every projection, the router and the MoE layer see."""
        return self.batch * self.length if self.phase == "prefill" else self.batch

    @property
    def q_len(self) -> int:
        """Queries per sequence in attention."""
        return self.length if self.phase == "prefill" else 1

    @property
    def head_rows(self) -> int:
        """Rows the LM head computes logits for: the last token of each prompt, or every decoded token."""
        return self.batch
