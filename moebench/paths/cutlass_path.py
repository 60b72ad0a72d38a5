"""The CUTLASS path: PyTorch's grouped GEMMs (CUTLASS kernels inside PyTorch on sm90).

``torch._grouped_mm`` (bf16) and ``torch._scaled_grouped_mm`` (fp8 e4m3 with
row-wise float32 scales) multiply a 2-D ``[T, K]`` operand, sorted by expert,
by a 3-D ``[E, K, N]`` weight, with ``offs`` the end offset of each expert's
group. Around them, plain torch ops do the sort, the SiLU-and-multiply, the
per-token activation quantization and the top-k sum; none synchronizes with
the host, so the whole layer is captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moebench.paths.base import Target, no_expert_map
from moebench.problem import MoEInputs, Problem
from moebench.quant import quantize_rows, quantize_static, quantize_tensor
from moebench.tile import TileConfig

_DTYPES = ("bf16", "fp8-tensor", "fp8-tensor-static", "fp8-channel")


def _group_by_expert(topk_ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids [M, topk] -> (order [T]: slots sorted by expert, offs [E] int32: group end offsets)."""
    flat = topk_ids.reshape(-1).long()  # [T]
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return order, counts.cumsum(0, dtype=torch.int32)


def _combine(y: torch.Tensor, order: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor) -> None:
    """y [T, H] in sorted order -> out [M, H] = sum over each token's top-k of routed weight * y."""
    M, topk = topk_weights.shape
    routed = topk_weights.reshape(-1)[order, None]  # [T, 1]
    unsorted = torch.empty_like(y, dtype=torch.float32)
    unsorted[order] = y.float() * routed
    out.copy_(unsorted.view(M, topk, -1).sum(dim=1))


def grouped_moe_bf16(x, w13, w2, topk_weights, topk_ids, out) -> None:
    """x [M, H], w13 [E, 2I, H], w2 [E, H, I] (bf16) -> out [M, H] via torch._grouped_mm."""
    E, two_i, _ = w13.shape
    order, offs = _group_by_expert(topk_ids, E)
    xs = x[order // topk_ids.shape[1]]  # [T, H]
    gate_up = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)  # [T, 2I]
    act = F.silu(gate_up[:, : two_i // 2]) * gate_up[:, two_i // 2 :]  # [T, I]
    y = torch._grouped_mm(act, w2.transpose(1, 2), offs=offs)  # [T, H]
    _combine(y, order, topk_weights, out)


def grouped_moe_fp8(x, w13, w2, s13, s2, topk_weights, topk_ids, out, per_tensor_act: bool,
                    act_scale: torch.Tensor | None = None) -> None:
    """fp8 weights w13 [E, 2I, H], w2 [E, H, I] with row-wise scales s13 [E, 2I], s2 [E, H].

    ``act_scale`` [2]: static per-tensor scales of the two GEMMs' inputs; else each is taken per batch.
    """
    E, two_i, _ = w13.shape
    order, offs = _group_by_expert(topk_ids, E)

    def quant(t: torch.Tensor, gemm: int) -> tuple[torch.Tensor, torch.Tensor]:  # fp8 [T, K], row scales [T]
        if act_scale is not None:
            return quantize_static(t, act_scale[gemm]), act_scale[gemm].expand(t.shape[0]).contiguous()
        if per_tensor_act:
            q, scale = quantize_tensor(t)
            return q, scale.expand(t.shape[0]).contiguous()
        return quantize_rows(t)

    xs = x[order // topk_ids.shape[1]]  # [T, H]
    xq, xscale = quant(xs, 0)
    gate_up = torch._scaled_grouped_mm(
        xq, w13.transpose(1, 2), xscale, s13, offs=offs, out_dtype=torch.bfloat16
    )  # [T, 2I]
    act = F.silu(gate_up[:, : two_i // 2]) * gate_up[:, two_i // 2 :]  # [T, I]
    aq, ascale = quant(act, 1)
    y = torch._scaled_grouped_mm(aq, w2.transpose(1, 2), ascale, s2, offs=offs, out_dtype=torch.bfloat16)
    _combine(y, order, topk_weights, out)


class CutlassPath:
    name = "cutlass"
    baseline = False
    tunable = False
    graph_safe = True

    def supports(self, problem: Problem, target: Target) -> str | None:
        if why := no_expert_map(problem, "the cutlass path"):
            return why
        if not target.is_sm90:
            return "the cutlass path needs an sm90 (Hopper) GPU: torch._grouped_mm's CUTLASS kernels"
        if problem.dtype == "fp8-block128":
            return "torch._scaled_grouped_mm takes row-wise scales only, not 128x128 blocks"
        if problem.dtype not in _DTYPES:
            return f"PyTorch's CUTLASS grouped GEMM takes {', '.join(_DTYPES)}, not {problem.dtype}"
        return None

    def prepare(self, inputs: MoEInputs, problem: Problem, config: TileConfig | None):
        w = inputs.weights
        x, tw, ids = inputs.x, inputs.topk_weights, inputs.topk_ids
        if w.fp8_scheme is None:
            return lambda out: grouped_moe_bf16(x, w.w13, w.w2, tw, ids, out)
        # Row-wise scales [E, N]; a per-tensor scale is the same value on every row (exact).
        s13, s2 = w.w13_scale, w.w2_scale
        if w.fp8_scheme == "tensor":
            s13 = s13[:, None].expand(-1, w.w13.shape[1]).contiguous()
            s2 = s2[:, None].expand(-1, w.w2.shape[1]).contiguous()
        per_tensor = w.fp8_scheme == "tensor"
        return lambda out: grouped_moe_fp8(x, w.w13, w.w2, s13, s2, tw, ids, out, per_tensor, w.act_scale)
