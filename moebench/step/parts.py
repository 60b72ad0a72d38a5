"""Each kind of layer of a model as a part: its weights built once on a device (random, from a seed), then prepared
per step point into a ``Prepared``: the closure that writes its output, the float32 reference of the same
computation, and the bytes and FLOPs of its floor.

    Attention  RMSNorm, QKV projection, rotary embedding, SDPA over the context, output projection
    Router     RMSNorm, gate GEMM [E, hidden], softmax top-k: probabilities, top-k weights and ids
    MoE        moebench's whole-layer path (paths.registry) on this GPU's MoEShape
    MLP        a shared expert (on the router's normed input) or a dense layer's MLP (with its own RMSNorm)
    Head       the final RMSNorm and the vocab-parallel LM head on the last token of each prompt / each decoded one

The parts other than the MoE layer run in the dtype's activation type (bf16 for the fp8 dtypes: their GEMMs are not
quantized here). Prepared closures never synchronize with the host (graph-safe), except the torch MoE path's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from moebench.dtypes import get_dtype
from moebench.paths.registry import get_path
from moebench.paths.torch_ref import moe_reference
from moebench.problem import MoEInputs, Problem, Weights, make_inputs, make_weights, rank0_map
from moebench.step import layers
from moebench.step.config import StepConfig, StepPoint
from moebench.tables import lookup
from moebench.tile import TileConfig

MLA_DECODE_NOTE = ("modelled: MLA decode in the absorbed form (attention over the kv_lora_rank + rope latent as one "
                   "KV head, through SDPA; FlashMLA is not run)")
MLA_PREFILL_NOTE = "MLA prefill in the naive form (the latent expanded per head)"


@dataclass
class Prepared:
    """One part at one step point, ready to check and time."""

    part: str  # "attention", "router", "moe", "shared", "dense_mlp", "head"
    run: Callable[[], None]  # writes ``out``
    out: torch.Tensor
    reference: Callable[[], torch.Tensor] | None  # float32 of the same computation; None: run is the reference
    rtol: float  # bound on ||out - ref|| / ||ref||
    bytes: int  # fewest bytes the part must move
    flops: int
    matmul_dtype: str = "bf16"  # the dtype whose matmul ceiling bounds its FLOPs
    graph_safe: bool = True
    notes: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)  # row fields of its own (the MoE path's config, experts touched)


def _randn(gen: torch.Generator, device, dtype, *shape: int, scale: float | None = None) -> torch.Tensor:
    """Random normal [shape] scaled by fan_in^-0.5 (the last dimension) so activations stay O(1)."""
    s = shape[-1] ** -0.5 if scale is None else scale
    return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).mul_(s).to(dtype)


def _ones(device, dtype, n: int, gen: torch.Generator) -> torch.Tensor:
    """A norm weight [n]: ones with a little noise (a real weight, not the identity)."""
    return (1 + 0.1 * torch.randn(n, generator=gen, device=device)).to(dtype)


def _float(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Float32 copies of every tensor of ``t`` (caches too: the reference writes its own)."""
    return {k: v.float().clone() for k, v in t.items()}


def _rtol(act: torch.dtype) -> float:
    """The tolerance of the parts' activation dtype (moebench.dtypes' table)."""
    return get_dtype({torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[act]).rtol


class Part:
    """What every part holds: the config, the activation dtype, the device and a generator seeded per part;
    ``part`` names it as its rows do."""

    part = ""

    def __init__(self, cfg: StepConfig, dtype: str, device: torch.device, seed: int, salt: int):
        self.cfg, self.dtype, self.device = cfg, dtype, device
        self.act = get_dtype(dtype).act
        self.gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + salt)

    def activations(self, point: StepPoint, x: torch.Tensor | None) -> torch.Tensor:
        """The part's input [tokens, hidden]: ``x`` where a stack passes its hidden state, else random."""
        if x is not None:
            return x
        return torch.randn(point.tokens, self.cfg.hidden, generator=self.gen, device=self.device,
                           dtype=torch.float32).to(self.act)

    def _rotary(self, point: StepPoint, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [tokens, dim / 2]: prompt positions 0..P-1 per sequence, or the last slot of each cache."""
        if point.phase == "prefill":
            cos, sin = layers.rotary(point.length, dim, self.device, self.act)
            return cos.repeat(point.batch, 1), sin.repeat(point.batch, 1)
        cos, sin = layers.rotary(1, dim, self.device, self.act, start=point.length - 1)
        return cos.expand(point.batch, -1).contiguous(), sin.expand(point.batch, -1).contiguous()

    def _prepared(self, name: str, fn: Callable[[dict], torch.Tensor], t: dict[str, torch.Tensor], nbytes: int,
                  flops: int, out: torch.Tensor, notes: tuple[str, ...] = (),
                  ref_fn: Callable[[dict], torch.Tensor] | None = None) -> Prepared:
        """A part whose output is ``fn(t)``: the closure copies it into ``out``; the reference runs ``ref_fn`` (else
        ``fn``) on float32 copies of ``t``."""
        ref_fn = ref_fn or fn

        def run() -> None:
            out.copy_(fn(t))

        return Prepared(name, run, out, lambda: ref_fn(_float(t)), _rtol(self.act), nbytes, flops,
                        notes=self.cfg.notes + notes)


class Attention(Part):
    """The attention block of one layer (GQA or MLA), this GPU's heads."""

    part = "attention"

    def __init__(self, cfg: StepConfig, dtype: str, device: torch.device, seed: int, layer: int = 0):
        super().__init__(cfg, dtype, device, seed, 100 + layer)
        g, a, H = self.gen, self.act, cfg.hidden
        w = {"norm": _ones(device, a, H, g)}
        if cfg.attention == "gqa":
            d = cfg.head_dim
            w["wqkv"] = _randn(g, device, a, (cfg.heads + 2 * cfg.kv_heads) * d, H)
            w["wo"] = _randn(g, device, a, H, cfg.heads * d)
        else:
            nope, rope, v, lora = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
            if cfg.q_lora_rank:
                w["q_a"] = _randn(g, device, a, cfg.q_lora_rank, H)
                w["q_a_norm"] = _ones(device, a, cfg.q_lora_rank, g)
            w["q_b"] = _randn(g, device, a, cfg.heads * (nope + rope), cfg.q_lora_rank or H)
            w["kv_a"] = _randn(g, device, a, lora + rope, H)
            w["kv_a_norm"] = _ones(device, a, lora, g)
            w["kv_b"] = _randn(g, device, a, cfg.heads * (nope + v), lora)
            w["wo"] = _randn(g, device, a, H, cfg.heads * v)
            kv_b = w["kv_b"].view(cfg.heads, nope + v, lora)
            w["w_uk"], w["w_uv"] = kv_b[:, :nope].contiguous(), kv_b[:, nope:].contiguous()  # absorbed decode's
        self.w = w

    def weight_bytes(self) -> int:
        skip = ("w_uk", "w_uv")  # views of kv_b, made contiguous: read in place of kv_b at decode
        return sum(t.numel() * t.element_size() for k, t in self.w.items() if k not in skip)

    def prepare(self, point: StepPoint, x: torch.Tensor | None = None) -> Prepared:
        cfg, b = self.cfg, torch.finfo(self.act).bits // 8
        t = {**self.w, "x": self.activations(point, x)}
        t["cos"], t["sin"] = self._rotary(point, cfg.qk_rope_head_dim if cfg.attention == "mla" else cfg.head_dim)
        M, kv_len, heads = point.tokens, point.length, cfg.heads
        decode = point.phase == "decode"
        if decode:  # the cache of ``length`` tokens per sequence
            if cfg.attention == "gqa":
                shape = (point.batch, cfg.kv_heads, kv_len, cfg.head_dim)
                t["k_cache"] = _randn(self.gen, self.device, self.act, *shape, scale=1.0)
                t["v_cache"] = _randn(self.gen, self.device, self.act, *shape, scale=1.0)
            else:
                t["cache"] = _randn(self.gen, self.device, self.act, point.batch, kv_len, cfg.kv_cache_width, scale=1.0)
        # Floor: weights, x in, out, and the cache read (decode) or K and V written and read once (prefill).
        kv_bytes = point.batch * kv_len * cfg.kv_cache_width * b * (1 if decode else 2)
        nbytes = self.weight_bytes() + 2 * M * cfg.hidden * b + kv_bytes
        proj = sum(t.numel() for k, t in self.w.items() if k not in ("norm", "q_a_norm", "kv_a_norm", "w_uk", "w_uv"))
        pairs = point.batch * (kv_len if decode else kv_len * (kv_len + 1) // 2)  # (query, key) pairs scored
        notes: tuple[str, ...] = ()
        if cfg.attention == "gqa":
            flops = 2 * M * proj + 2 * pairs * heads * (cfg.head_dim + cfg.head_dim)
            fn = ref = lambda t: layers.gqa(t, point.batch, point.q_len, heads, cfg.kv_heads, cfg.head_dim)
        else:
            nope, rope, v, lora = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank

            def form(absorbed: bool):
                return lambda t: layers.mla(t, point.batch, point.q_len, heads, nope, rope, v, lora, absorbed)

            if decode:  # absorbed: q and o through w_uk / w_uv, scores over the latent
                proj -= self.w["kv_b"].numel()
                flops = 2 * M * proj + 2 * M * heads * lora * (nope + v) + 2 * pairs * heads * (lora + rope + lora)
                fn, ref, notes = form(True), form(False), (MLA_DECODE_NOTE,)
            else:
                flops = 2 * M * proj + 2 * pairs * heads * (nope + rope + v)
                fn = ref = form(False)
                notes = (MLA_PREFILL_NOTE,)
        out = torch.empty(M, cfg.hidden, device=self.device, dtype=self.act)
        return self._prepared(self.part, fn, t, nbytes, flops, out, notes, ref)


class Router(Part):
    """The router of one MoE layer: the post-attention RMSNorm, the gate over every expert (replicated under TP),
    softmax top-k. Its outputs are the MoE layer's inputs: ``normed`` [M, hidden], ``weights``/``ids`` [M, topk]."""

    part = "router"

    def __init__(self, cfg: StepConfig, dtype: str, device: torch.device, seed: int, layer: int = 0):
        super().__init__(cfg, dtype, device, seed, 200 + layer)
        self.w = {"norm": _ones(device, self.act, cfg.hidden, self.gen),
                  "gate": _randn(self.gen, device, self.act, cfg.moe.routed_experts, cfg.hidden)}

    def prepare(self, point: StepPoint, x: torch.Tensor | None = None) -> Prepared:
        cfg, M, b = self.cfg, point.tokens, torch.finfo(self.act).bits // 8
        E, k = cfg.moe.routed_experts, cfg.moe.topk
        t = {**self.w, "x": self.activations(point, x)}
        probs = torch.empty(M, E, device=self.device, dtype=torch.float32)
        normed = torch.empty(M, cfg.hidden, device=self.device, dtype=self.act)
        weights = torch.empty(M, k, device=self.device, dtype=torch.float32)
        ids = torch.empty(M, k, device=self.device, dtype=torch.int32)

        def run() -> None:
            normed.copy_(layers.rms_norm(t["x"], t["norm"]))
            p, w, i = layers.router(normed, t["gate"], k)
            probs.copy_(p)
            weights.copy_(w)
            ids.copy_(i)

        def reference() -> torch.Tensor:
            f = _float(t)
            return layers.router(layers.rms_norm(f["x"], f["norm"]), f["gate"], k)[0]

        nbytes = E * cfg.hidden * b + M * cfg.hidden * b * 2 + M * E * 4 + M * k * 8
        p = Prepared("router", run, probs, reference, _rtol(self.act), nbytes, 2 * M * cfg.hidden * E,
                     notes=self.cfg.notes)
        p.extra = {"normed": normed, "weights": weights, "ids": ids}
        return p


class MLP(Part):
    """A shared expert (``shared``: on the router's normed input) or a dense layer's MLP (its RMSNorm first)."""

    def __init__(self, cfg: StepConfig, dtype: str, device: torch.device, seed: int, shared: bool, layer: int = 0):
        super().__init__(cfg, dtype, device, seed, (300 if shared else 400) + layer)
        self.shared = shared
        self.part = "shared" if shared else "dense_mlp"
        inter = cfg.shared_intermediate if shared else cfg.dense_intermediate
        self.w = {"w13": _randn(self.gen, device, self.act, 2 * inter, cfg.hidden),
                  "w2": _randn(self.gen, device, self.act, cfg.hidden, inter)}
        if not shared:
            self.w["norm"] = _ones(device, self.act, cfg.hidden, self.gen)

    def prepare(self, point: StepPoint, x: torch.Tensor | None = None) -> Prepared:
        M, b, H = point.tokens, torch.finfo(self.act).bits // 8, self.cfg.hidden
        t = {**self.w, "x": self.activations(point, x)}
        inter = self.w["w2"].shape[1]

        def fn(t: dict) -> torch.Tensor:
            h = t["x"] if self.shared else layers.rms_norm(t["x"], t["norm"])
            return layers.mlp(h, t["w13"], t["w2"])

        out = torch.empty(M, H, device=self.device, dtype=self.act)
        return self._prepared(self.part, fn, t, 3 * inter * H * b + 2 * M * H * b,
                              2 * M * 3 * inter * H, out)


class Head(Part):
    """The final RMSNorm and the LM head [vocab / tp, hidden]: logits of each prompt's last token, or of every
    decoded token (the all-gather of the vocab shards is not modelled)."""

    part = "head"

    def __init__(self, cfg: StepConfig, dtype: str, device: torch.device, seed: int):
        super().__init__(cfg, dtype, device, seed, 500)
        self.w = {"norm": _ones(device, self.act, cfg.hidden, self.gen),
                  "lm_head": _randn(self.gen, device, self.act, cfg.vocab, cfg.hidden)}

    def prepare(self, point: StepPoint, x: torch.Tensor | None = None) -> Prepared:
        cfg, rows, b = self.cfg, point.head_rows, torch.finfo(self.act).bits // 8
        t = {**self.w, "x": self.activations(point, x)}
        per_seq = point.length if point.phase == "prefill" else 1

        def fn(t: dict) -> torch.Tensor:
            last = t["x"].view(point.batch, per_seq, cfg.hidden)[:, -1]  # [rows, hidden]
            return layers.rms_norm(last, t["norm"]) @ t["lm_head"].T  # [rows, vocab]

        out = torch.empty(rows, cfg.vocab, device=self.device, dtype=self.act)
        nbytes = cfg.vocab * cfg.hidden * b + rows * (cfg.hidden + cfg.vocab) * b
        return self._prepared(self.part, fn, t, nbytes, 2 * rows * cfg.hidden * cfg.vocab, out)


class MoE:
    """One MoE layer's weights (``make_weights``, as sweeps build them), prepared per point and path."""

    def __init__(self, cfg: StepConfig, dtype: str, device: torch.device, seed: int, layer: int = 0):
        self.cfg, self.dtype, self.device, self.seed = cfg, dtype, device, seed
        self.weights: Weights = make_weights(cfg.moe, dtype, seed + layer, device)

    def problem(self, point: StepPoint) -> Problem:
        return Problem(self.cfg.moe, point.tokens, self.dtype, seed=self.seed)

    def inputs(self, point: StepPoint, routed: dict | None = None) -> MoEInputs:
        """The layer's inputs: the router's outputs where a stack passes them (``routed``), else the synthetic
        uniform routing a sweep runs (``make_inputs``)."""
        if routed is None:
            return make_inputs(self.problem(point), self.device, self.weights)
        return MoEInputs(routed["normed"], routed["weights"], routed["ids"], self.weights,
                         rank0_map(self.cfg.moe, self.device))

    def prepare(self, point: StepPoint, path_name: str, inputs: MoEInputs, reference: torch.Tensor | None,
                tiles: Tiles | None = None) -> Prepared:
        """The MoE layer through ``path_name`` on ``inputs`` (``reference``: their float32 output, shared by the
        paths of one point; None for a stack, which is not checked), its config as ``tiles`` picks it."""
        problem, path = self.problem(point), get_path(path_name)
        config, source = (tiles or Tiles()).pick(path, problem)
        fn = path.prepare(inputs, problem, config)
        out = torch.empty(point.tokens, self.cfg.hidden, device=self.device, dtype=problem.spec.act)
        touched, slots = inputs.experts_touched, inputs.local_slots
        ref = None if path.baseline or reference is None else (lambda: reference)
        p = Prepared("moe", lambda: fn(out), out, ref, problem.spec.rtol, problem.min_bytes(touched),
                     problem.slot_flops(slots), matmul_dtype=self.dtype, graph_safe=path.graph_safe)
        p.extra = {"config": None if config is None else config.as_dict(), "config_source": source,
                   "experts_touched": touched}
        return p

    def reference(self, inputs: MoEInputs) -> torch.Tensor:
        return moe_reference(inputs.x, inputs.weights, inputs.topk_weights, inputs.topk_ids,
                             expert_map=inputs.expert_map)


@dataclass(frozen=True)
class Tiles:
    """Where the MoE paths' tile configs come from: moebench's kernel from its tables (``configs_dir`` first, as
    a sweep looks), the engines' form from the engines' file in ``configs_dir`` (vLLM's name; its shipped table or
    an export), else its default; ``fields`` set on each of moebench's configs ((name, value)
    pairs, e.g. ``swap_ab`` off) run a variant of the chosen config, and its source says so."""

    configs_dir: str | None = None
    fields: tuple[tuple[str, Any], ...] = ()

    def pick(self, path, problem: Problem) -> tuple[TileConfig | None, str | None]:
        """The tile config ``path`` runs ``problem`` with and where it came from; None for a path without tiles."""
        if not path.tunable:
            return None, None
        if path.name != "triton":
            engine = lookup.engine_table_for(problem, self.configs_dir) if path.name == "triton-classic" else None
            return (path.default_config(problem), "heuristic") if engine is None else (engine.config, engine.label)
        chosen = lookup.for_problem(problem, path.default_config(problem), self.configs_dir)
        if not self.fields:
            return chosen.config, chosen.label
        config = TileConfig.from_dict({**chosen.config.as_dict(), **dict(self.fields)})
        return config, f"{chosen.label}, " + ", ".join(f"{k}={v} set" for k, v in self.fields)
