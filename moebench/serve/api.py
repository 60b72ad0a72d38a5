"""moebench's fused-MoE kernels as a library call, in vLLM's layout and conventions.

``fused_moe`` checks the layer's tensors and quantization arguments (shapes, dtypes, devices, combinations: a
one-line UserError each), brings the routing to the kernels' dtypes (weights float32, ids and expert_map int32),
takes the tile config it is given or the one ``config_for`` finds (a tuned table, else the fitted default of the
other tables, else the heuristic the benchmark's triton path runs) and launches ``moebench.kernels.fused_moe``.
The checks read shapes only: nothing waits on the device, so a call can be captured in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from moebench import environment
from moebench._interpret import interpreting
from moebench.dtypes import DTYPES
from moebench.errors import UserError
from moebench.kernels.fused_moe import fused_moe as launch
from moebench.measure.failures import out_of_resources
from moebench.quant import FP8, scale_shape
from moebench.tables import lookup
from moebench.tile import TileConfig, default_config

SCHEMES = (None, "tensor", "channel", "block", "block128")  # fp8_scheme values; "block128": "block" at [128, 128]
BLOCK_SIDES = (64, 128)  # the block_shape sides the kernels are checked at
_PLAIN = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}  # x's dtype -> dtype name


@dataclass(frozen=True)
class _Quant:
    """The fp8 arguments of a call, checked, as the kernels take them."""

    scheme: str | None  # the kernels' fp8_scheme: None, "tensor", "channel", "block128" (any block shape)
    act_per_tensor: bool = False  # "channel" weights, one activation scale per tensor
    block_shape: tuple[int, int] = (128, 128)  # "block128": (block_n, block_k)


def _quant(fp8_scheme: str | None, block_shape: Sequence[int] | None, per_act_token_quant: bool | None,
           act_scale: torch.Tensor | None) -> _Quant:
    """The checked fp8 arguments (UserError, one line, for a combination the kernels do not run).

    ``per_act_token_quant`` (vLLM's name): None gives each scheme its own activation scales (per token with
    "channel", one per tensor with "tensor" or with a static ``act_scale``); False with "channel" weights gives
    one activation scale per tensor."""
    if fp8_scheme not in SCHEMES:
        raise UserError(f"fused_moe: unknown fp8_scheme {fp8_scheme!r}; known: {', '.join(map(str, SCHEMES))}")
    block = fp8_scheme in ("block", "block128")
    if block_shape is not None and not block:
        raise UserError(f"fused_moe: block_shape is for fp8_scheme='block', not {fp8_scheme!r}")
    shape = (128, 128) if block_shape is None else tuple(int(b) for b in block_shape)
    if block and (len(shape) != 2 or any(b not in BLOCK_SIDES for b in shape)):
        raise UserError(f"fused_moe: block_shape {list(shape)} is [block_n, block_k], each one of "
                        f"{', '.join(map(str, BLOCK_SIDES))}")
    if fp8_scheme == "block128" and shape != (128, 128):
        raise UserError(f"fused_moe: fp8_scheme='block128' is block_shape [128, 128], not {list(shape)}; "
                        "use fp8_scheme='block'")
    if per_act_token_quant is not None and fp8_scheme not in ("tensor", "channel"):
        why = " (block scales quantize activations in 1 x block_k groups)" if block else ""
        raise UserError(f"fused_moe: per_act_token_quant is for fp8_scheme 'tensor' or 'channel', not "
                        f"{fp8_scheme!r}{why}")
    if fp8_scheme == "tensor" and per_act_token_quant:
        raise UserError("fused_moe: per-token activation scales with per-tensor weight scales are not supported; "
                        "use fp8_scheme='channel'")
    if fp8_scheme == "channel" and per_act_token_quant and act_scale is not None:
        raise UserError("fused_moe: act_scale holds one static scale per tensor; per_act_token_quant=True asks for "
                        "one per token")
    act_per_tensor = fp8_scheme == "channel" and (per_act_token_quant is False or act_scale is not None)
    if act_scale is not None and (not (fp8_scheme == "tensor" or act_per_tensor) or act_scale.numel() != 2):
        raise UserError("fused_moe: act_scale is the [2] static per-tensor input scales of GEMM1 and GEMM2, for "
                        f"fp8_scheme 'tensor' or 'channel' (got {_shape(act_scale)} with {fp8_scheme!r})")
    return _Quant("block128" if block else fp8_scheme, act_per_tensor, shape)


def dtype_name(act: torch.dtype, fp8_scheme: str | None, static: bool = False,
               block_shape: tuple[int, int] = (128, 128)) -> str:
    """The moebench dtype name (``moebench.dtypes``) tables are keyed by, e.g. "fp16" or "fp8-tensor-static";
    fp8 blocks other than 128x128 have none (no table is read); "channel" weights read fp8-channel's."""
    if fp8_scheme is None:
        return _PLAIN[act]
    if fp8_scheme in ("block", "block128"):
        return "fp8-block{}x{}".format(*block_shape) if block_shape != (128, 128) else "fp8-block128"
    return f"fp8-{fp8_scheme}" + ("-static" if static and fp8_scheme == "tensor" else "")


@dataclass(frozen=True)
class _Layer:
    """What the config lookup needs to know of a checked layer."""

    M: int  # tokens
    experts: int  # E
    intermediate: int  # I, per GPU (vLLM's N)
    hidden: int  # K of GEMM1
    topk: int
    weight_bytes: int  # bytes per element of w13
    dtype: str  # moebench dtype name
    device: torch.device
    routed_experts: int  # experts the ids range over: E, or the global experts of an expert_map


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(map(str, t.shape)) + "]"


def _check(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor, quant: _Quant,
           act_scale: torch.Tensor | None, expert_map: torch.Tensor | None = None,
           **others: torch.Tensor | None) -> _Layer:
    """The layer's sizes, once its tensors agree (UserError, one line, naming what does not); ``others`` are
    further tensors that must be on x's device."""
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or topk_ids.dim() != 2:
        raise UserError(f"fused_moe: expected x [M, hidden], w13 [E, 2I, hidden], w2 [E, hidden, I], topk_ids "
                        f"[M, topk]; got {_shape(x)}, {_shape(w13)}, {_shape(w2)}, {_shape(topk_ids)}")
    (M, H), (E, two_i, _), I = x.shape, w13.shape, w2.shape[2]
    if two_i % 2:
        raise UserError(f"fused_moe: w13 {_shape(w13)}: its second dim holds gate rows then up rows (2I), not odd")
    if w2.shape[0] != E or w2.shape[2] != two_i // 2:
        raise UserError(f"fused_moe: w13 {_shape(w13)} [E, 2I, hidden] and w2 {_shape(w2)} [E, hidden, I] "
                        "disagree on E or I")
    if w13.shape[2] != H or w2.shape[1] != H:
        raise UserError(f"fused_moe: x {_shape(x)}, w13 {_shape(w13)} and w2 {_shape(w2)} disagree on hidden")
    if topk_ids.shape[0] != M:
        raise UserError(f"fused_moe: topk_ids {_shape(topk_ids)} has not a row per token of x {_shape(x)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise UserError(f"fused_moe: topk_ids must be int32 or int64, not {topk_ids.dtype}")
    fp8_scheme = quant.scheme
    if expert_map is not None and (expert_map.dim() != 1 or expert_map.dtype not in (torch.int32, torch.int64)):
        raise UserError(f"fused_moe: expert_map must be an int32 [global experts] tensor (a local expert index or -1 "
                        f"per global id), got {_shape(expert_map)} {expert_map.dtype}")
    if x.dtype not in _PLAIN:
        raise UserError(f"fused_moe: x must be bf16, fp16 or fp32, not {x.dtype}")
    want = FP8 if fp8_scheme else x.dtype
    if w13.dtype != want or w2.dtype != want:
        raise UserError(f"fused_moe: with fp8_scheme={fp8_scheme!r} and x {x.dtype} the weights must be {want}, "
                        f"not {w13.dtype} and {w2.dtype}")
    tensors = {"w13": w13, "w2": w2, "topk_ids": topk_ids, "act_scale": act_scale, "expert_map": expert_map,
               **others}
    for name, t in tensors.items():
        if t is not None and t.device != x.device:
            raise UserError(f"fused_moe: x is on {x.device} but {name} on {t.device}; put every tensor on one device")
    if x.device.type != "cuda" and not interpreting():
        raise UserError(f"fused_moe: tensors on {x.device}: Triton kernels need a CUDA GPU or the interpreter "
                        "(TRITON_INTERPRET=1)")
    name = dtype_name(x.dtype, fp8_scheme, act_scale is not None, quant.block_shape)
    if name == "bf16" and interpreting():
        raise UserError("fused_moe: the Triton interpreter computes bf16 tl.dot wrongly; use fp16 or fp32 on the CPU")
    routed = E if expert_map is None else expert_map.shape[0]
    return _Layer(M, E, I, H, topk_ids.shape[1], w13.element_size(), name, x.device, routed)


def _check_weight_scales(w13: torch.Tensor, w2: torch.Tensor, quant: _Quant,
                         w13_scale: torch.Tensor | None, w2_scale: torch.Tensor | None) -> None:
    """UserError unless the weight scales are there for an fp8 scheme, shaped as ``moebench.quant`` says."""
    fp8_scheme, (bn, bk) = quant.scheme, quant.block_shape
    if fp8_scheme is None:
        if w13_scale is not None or w2_scale is not None:
            raise UserError("fused_moe: weight scales are for fp8 weights; give fp8_scheme or no scales")
        return
    for w, scale, name in ((w13, w13_scale, "w13"), (w2, w2_scale, "w2")):
        want = scale_shape(tuple(w.shape), fp8_scheme, (bn, bk))
        if scale is None or tuple(scale.shape) != want:
            got = "none" if scale is None else _shape(scale)
            raise UserError(f"fused_moe: fp8_scheme={fp8_scheme!r} needs {name}_scale [{', '.join(map(str, want))}] "
                            f"float32 for {name} {_shape(w)}, got {got}")


def _tile(config: TileConfig | Mapping) -> TileConfig:
    """A TileConfig as given, or one from a dict of vLLM's six keys or moebench's fields."""
    if isinstance(config, TileConfig):
        return config
    if isinstance(config, Mapping):
        return TileConfig.from_dict(config)
    raise UserError(f"fused_moe: config must be None, a TileConfig or a dict, not {type(config).__name__}")


def _choose(layer: _Layer, quant: _Quant, configs_dir) -> lookup.Chosen:
    heuristic = default_config(layer.M, layer.routed_experts, layer.topk, layer.weight_bytes, quant.scheme)
    if quant.scheme == "block128":  # K steps by one scale block
        heuristic = replace(heuristic, BLOCK_SIZE_K=quant.block_shape[1])
    folder = lookup.check_dir(configs_dir, what="configs_dir")
    if layer.dtype not in DTYPES:  # no table is made for it
        return lookup.Chosen(heuristic, "heuristic")
    return lookup.choose(layer.M, layer.experts, layer.intermediate, layer.dtype, environment.device_name(layer.device),
                         heuristic, folder, hidden=layer.hidden, topk=layer.topk,
                         fit=layer.routed_experts == layer.experts)


def config_for(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor, *,
               fp8_scheme: str | None = None, act_scale: torch.Tensor | None = None, configs_dir=None,
               expert_map: torch.Tensor | None = None, block_shape: Sequence[int] | None = None,
               per_act_token_quant: bool | None = None) -> lookup.Chosen:
    """The tile config ``fused_moe`` runs these tensors with when given none, and where it comes from
    (``Chosen.source``: "configs", "env", "shipped", "fitted" or "heuristic"; ``table_m`` the key read).

    Tables are looked for in ``configs_dir``, then ``$MOEBENCH_CONFIGS``, then those shipped with moebench, by
    (E, I, device name, dtype name), and read at the key nearest M; without one, the fitted default of the
    device's other tables (``moebench.tables.fitted``), else the triton path's heuristic (sized for the slots per
    expert: with ``expert_map``, per global expert).
    """
    quant = _quant(fp8_scheme, block_shape, per_act_token_quant, act_scale)
    return _choose(_check(x, w13, w2, topk_ids, quant, act_scale, expert_map), quant, configs_dir)


def fused_moe(
    x: torch.Tensor,  # [M, hidden] bf16/fp16/fp32
    w13: torch.Tensor,  # [E, 2I, hidden]: gate rows, then up rows (vLLM's w13_weight)
    w2: torch.Tensor,  # [E, hidden, I]
    topk_weights: torch.Tensor,  # [M, topk] any float dtype
    topk_ids: torch.Tensor,  # [M, topk] int32 or int64, each in [0, E), or global ids with expert_map
    *,
    fp8_scheme: str | None = None,  # None, "tensor", "channel", "block" (block_shape), "block128"
    w13_scale: torch.Tensor | None = None,  # float32, fp8 only: [E], [E, 2I] or [E, cdiv(2I, bn), cdiv(hidden, bk)]
    w2_scale: torch.Tensor | None = None,  # float32, fp8 only: [E], [E, hidden] or [E, cdiv(hidden, bn), cdiv(I, bk)]
    act_scale: torch.Tensor | None = None,  # [2] float32 static per-tensor input scales of GEMM1 and GEMM2
    config: TileConfig | Mapping | None = None,  # None: ``config_for``'s
    configs_dir=None,  # a folder of moebench tables, looked in first (config=None only)
    out: torch.Tensor | None = None,  # [M, hidden], x's dtype
    expert_map: torch.Tensor | None = None,  # [global experts] int32: local expert of each global id, -1 elsewhere
    apply_router_weight_on_input: bool = False,  # top-k 1 only: x times its routed weight before GEMM1
    block_shape: Sequence[int] | None = None,  # "block": [block_n, block_k] of the weight scales, each 64 or 128
    per_act_token_quant: bool | None = None,  # "channel": False for one activation scale per tensor
) -> torch.Tensor:
    """The MoE layer ``sum_j topk_weights[t, j] * w2[e_j] @ (silu(gate_e_j @ x[t]) * (up_e_j @ x[t]))`` for
    each token t, with e_j = topk_ids[t, j]; returns ``out`` [M, hidden] in x's dtype.

    As vLLM's fused-experts call:

    - ``expert_map`` (expert parallelism): ``topk_ids`` hold global ids, the weights local experts only; a slot
      whose expert maps to -1 (another rank's) adds nothing, and a token with no local expert gets zeros.
    - ``apply_router_weight_on_input``: the routed weight multiplies x before GEMM1 (in x's dtype, before fp8
      quantization), not GEMM2's output; top-k must be 1.
    - ``fp8_scheme="block"``: weight scales per ``block_shape`` [block_n, block_k] block (default [128, 128],
      which "block128" names), activations in 1 x block_k groups; a tile config's BLOCK_SIZE_K is block_k.
    - ``fp8_scheme="channel"`` with ``per_act_token_quant=False`` or a static ``act_scale``: per-channel weight
      scales with one activation scale per tensor (dynamic, or the static one given).

    Shapes, dtypes, devices and argument combinations are checked on the host (UserError, one line); the expert
    ids' range is not, since that would wait on the device: an id outside [0, E) (or outside expert_map) reads or
    writes out of bounds.
    """
    quant = _quant(fp8_scheme, block_shape, per_act_token_quant, act_scale)
    layer = _check(x, w13, w2, topk_ids, quant, act_scale, expert_map, topk_weights=topk_weights,
                   w13_scale=w13_scale, w2_scale=w2_scale, out=out)
    if topk_weights.shape != topk_ids.shape or not topk_weights.is_floating_point():
        raise UserError(f"fused_moe: topk_weights {_shape(topk_weights)} {topk_weights.dtype} must be float, "
                        f"shaped as topk_ids {_shape(topk_ids)}")
    if apply_router_weight_on_input and layer.topk != 1:
        raise UserError(f"fused_moe: apply_router_weight_on_input is only implemented for topk=1 (as in vLLM), "
                        f"got topk={layer.topk}")
    _check_weight_scales(w13, w2, quant, w13_scale, w2_scale)
    if w13.stride(2) != 1 or w2.stride(2) != 1:
        raise UserError("fused_moe: the weights' last dim must be contiguous (w13.stride(2) == w2.stride(2) == 1)")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.stride(1) != 1):
        raise UserError(f"fused_moe: out {_shape(out)} {out.dtype} must be shaped and typed as x {_shape(x)} "
                        f"{x.dtype}, its rows contiguous")
    chosen = None if config is not None else _choose(layer, quant, configs_dir)
    tile = _tile(config) if chosen is None else chosen.config
    x = x if x.stride(1) == 1 else x.contiguous()
    weights = topk_weights.to(torch.float32).contiguous()  # [M, topk]
    ids = topk_ids.to(torch.int32).contiguous()  # [M, topk]
    local = None if expert_map is None else expert_map.to(torch.int32).contiguous()  # [global experts]

    def run(tile: TileConfig) -> torch.Tensor:
        return launch(x, w13, w2, weights, ids, tile, out=out, fp8_scheme=quant.scheme, w13_scale=w13_scale,
                      w2_scale=w2_scale, act_scale=act_scale, act_per_tensor=quant.act_per_tensor,
                      block_shape=quant.block_shape, expert_map=local,
                      apply_router_weight_on_input=apply_router_weight_on_input)

    if chosen is None or chosen.source != "fitted":
        return run(tile)
    try:
        return run(tile)
    except Exception as e:  # a carried config the device cannot hold: the heuristic's, which fits by construction
        if not out_of_resources(e):
            raise
        lookup.refuse_fitted(chosen.config, layer.experts, layer.intermediate, layer.dtype, hidden=layer.hidden,
                             topk=layer.topk)
        return run(_choose(layer, quant, configs_dir).config)
