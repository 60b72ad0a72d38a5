"""moebench's fused-MoE kernels as a library call, in vLLM's layout and conventions.

``fused_moe`` checks the layer's tensors (shapes, dtypes, devices: a one-line UserError each), brings the routing
to the kernels' dtypes (weights float32, ids int32), takes the tile config it is given or the one ``config_for``
finds (a tuned table, else the fitted default of the other tables, else the heuristic the benchmark's triton
path runs) and launches ``moebench.kernels.fused_moe``. The checks read shapes only: nothing waits on the
device, so a call can be captured in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from moebench import environment
from moebench._interpret import interpreting
from moebench.errors import UserError
from moebench.kernels.fused_moe import fused_moe as launch
from moebench.quant import FP8
from moebench.tables import lookup
from moebench.tile import TileConfig, default_config

SCHEMES = (None, "tensor", "channel", "block128")  # fp8_scheme values
_PLAIN = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}  # x's dtype -> dtype name


def dtype_name(act: torch.dtype, fp8_scheme: str | None, static: bool = False) -> str:
    """The moebench dtype name (``moebench.dtypes``) tables are keyed by, e.g. "fp16" or "fp8-tensor-static"."""
    if fp8_scheme is None:
        return _PLAIN[act]
    return f"fp8-{fp8_scheme}" + ("-static" if static else "")


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


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(map(str, t.shape)) + "]"


def _check(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor, fp8_scheme: str | None,
           act_scale: torch.Tensor | None, **others: torch.Tensor | None) -> _Layer:
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
    if fp8_scheme not in SCHEMES:
        raise UserError(f"fused_moe: unknown fp8_scheme {fp8_scheme!r}; known: {', '.join(map(str, SCHEMES))}")
    if x.dtype not in _PLAIN:
        raise UserError(f"fused_moe: x must be bf16, fp16 or fp32, not {x.dtype}")
    want = FP8 if fp8_scheme else x.dtype
    if w13.dtype != want or w2.dtype != want:
        raise UserError(f"fused_moe: with fp8_scheme={fp8_scheme!r} and x {x.dtype} the weights must be {want}, "
                        f"not {w13.dtype} and {w2.dtype}")
    if act_scale is not None and (fp8_scheme != "tensor" or act_scale.numel() != 2):
        raise UserError("fused_moe: act_scale is the [2] static input scales of GEMM1 and GEMM2, for "
                        f"fp8_scheme='tensor' only (got {_shape(act_scale)} with {fp8_scheme!r})")
    tensors = {"w13": w13, "w2": w2, "topk_ids": topk_ids, "act_scale": act_scale, **others}
    for name, t in tensors.items():
        if t is not None and t.device != x.device:
            raise UserError(f"fused_moe: x is on {x.device} but {name} on {t.device}; put every tensor on one device")
    if x.device.type != "cuda" and not interpreting():
        raise UserError(f"fused_moe: tensors on {x.device}: Triton kernels need a CUDA GPU or the interpreter "
                        "(TRITON_INTERPRET=1)")
    name = dtype_name(x.dtype, fp8_scheme, act_scale is not None)
    if name == "bf16" and interpreting():
        raise UserError("fused_moe: the Triton interpreter computes bf16 tl.dot wrongly; use fp16 or fp32 on the CPU")
    return _Layer(M, E, I, H, topk_ids.shape[1], w13.element_size(), name, x.device)


def _check_weight_scales(w13: torch.Tensor, w2: torch.Tensor, fp8_scheme: str | None,
                         w13_scale: torch.Tensor | None, w2_scale: torch.Tensor | None) -> None:
    """UserError unless the weight scales are there for an fp8 scheme, shaped as ``moebench.quant`` says."""
    if fp8_scheme is None:
        if w13_scale is not None or w2_scale is not None:
            raise UserError("fused_moe: weight scales are for fp8 weights; give fp8_scheme or no scales")
        return
    for w, scale, name in ((w13, w13_scale, "w13"), (w2, w2_scale, "w2")):
        E, N, K = w.shape
        want = {"tensor": (E,), "channel": (E, N), "block128": (E, -(-N // 128), -(-K // 128))}[fp8_scheme]
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


def _choose(layer: _Layer, fp8_scheme: str | None, configs_dir) -> lookup.Chosen:
    heuristic = default_config(layer.M, layer.experts, layer.topk, layer.weight_bytes, fp8_scheme)
    return lookup.choose(layer.M, layer.experts, layer.intermediate, layer.dtype, environment.device_name(layer.device),
                         heuristic, lookup.check_dir(configs_dir, what="configs_dir"), hidden=layer.hidden,
                         topk=layer.topk)


def config_for(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor, *,
               fp8_scheme: str | None = None, act_scale: torch.Tensor | None = None,
               configs_dir=None) -> lookup.Chosen:
    """The tile config ``fused_moe`` runs these tensors with when given none, and where it comes from
    (``Chosen.source``: "configs", "env", "shipped", "fitted" or "heuristic"; ``table_m`` the key read).

    Tables are looked for in ``configs_dir``, then ``$MOEBENCH_CONFIGS``, then those shipped with moebench, by
    (E, I, device name, dtype name), and read at the key nearest M; without one, the fitted default of the
    device's other tables (``moebench.tables.fitted``), else the triton path's heuristic.
    """
    return _choose(_check(x, w13, w2, topk_ids, fp8_scheme, act_scale), fp8_scheme, configs_dir)


def fused_moe(
    x: torch.Tensor,  # [M, hidden] bf16/fp16/fp32
    w13: torch.Tensor,  # [E, 2I, hidden]: gate rows, then up rows (vLLM's w13_weight)
    w2: torch.Tensor,  # [E, hidden, I]
    topk_weights: torch.Tensor,  # [M, topk] any float dtype
    topk_ids: torch.Tensor,  # [M, topk] int32 or int64, each in [0, E)
    *,
    fp8_scheme: str | None = None,  # None, "tensor", "channel", "block128"
    w13_scale: torch.Tensor | None = None,  # float32, fp8 only: [E], [E, 2I] or [E, cdiv(2I,128), cdiv(hidden,128)]
    w2_scale: torch.Tensor | None = None,  # float32, fp8 only: [E], [E, hidden] or [E, cdiv(hidden,128), cdiv(I,128)]
    act_scale: torch.Tensor | None = None,  # [2] float32 static input scales of GEMM1 and GEMM2 ("tensor" only)
    config: TileConfig | Mapping | None = None,  # None: ``config_for``'s
    configs_dir=None,  # a folder of moebench tables, looked in first (config=None only)
    out: torch.Tensor | None = None,  # [M, hidden], x's dtype
) -> torch.Tensor:
    """The MoE layer ``sum_j topk_weights[t, j] * w2[e_j] @ (silu(gate_e_j @ x[t]) * (up_e_j @ x[t]))`` for
    each token t, with e_j = topk_ids[t, j]; returns ``out`` [M, hidden] in x's dtype.

    Shapes, dtypes and devices are checked on the host (UserError, one line); the expert ids' range is not,
    since that would wait on the device: an id outside [0, E) reads or writes out of bounds.
    """
    layer = _check(x, w13, w2, topk_ids, fp8_scheme, act_scale, topk_weights=topk_weights, w13_scale=w13_scale,
                   w2_scale=w2_scale, out=out)
    if topk_weights.shape != topk_ids.shape or not topk_weights.is_floating_point():
        raise UserError(f"fused_moe: topk_weights {_shape(topk_weights)} {topk_weights.dtype} must be float, "
                        f"shaped as topk_ids {_shape(topk_ids)}")
    _check_weight_scales(w13, w2, fp8_scheme, w13_scale, w2_scale)
    if w13.stride(2) != 1 or w2.stride(2) != 1:
        raise UserError("fused_moe: the weights' last dim must be contiguous (w13.stride(2) == w2.stride(2) == 1)")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.stride(1) != 1):
        raise UserError(f"fused_moe: out {_shape(out)} {out.dtype} must be shaped and typed as x {_shape(x)} "
                        f"{x.dtype}, its rows contiguous")
    tile = _tile(config) if config is not None else _choose(layer, fp8_scheme, configs_dir).config
    x = x if x.stride(1) == 1 else x.contiguous()
    weights = topk_weights.to(torch.float32).contiguous()  # [M, topk]
    ids = topk_ids.to(torch.int32).contiguous()  # [M, topk]
    return launch(x, w13, w2, weights, ids, tile, out=out, fp8_scheme=fp8_scheme, w13_scale=w13_scale,
                  w2_scale=w2_scale, act_scale=act_scale)
