"""The float32 PyTorch reference: the definition every other path is checked against.

It loops over experts on the host (it synchronizes, so it is timed eagerly,
never in a CUDA graph); fp8 weights are dequantized one expert at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moebench.paths.base import Target
from moebench.problem import MoEInputs, Problem, Weights
from moebench.quant import dequantize_weight
from moebench.tile import TileConfig


def _expert_weight(w: torch.Tensor, scale: torch.Tensor | None, scheme: str | None, e: int) -> torch.Tensor:
    return dequantize_weight(w[e], None if scale is None else scale[e], scheme)


def moe_reference(
    x: torch.Tensor,  # [M, hidden]
    weights: Weights,
    topk_weights: torch.Tensor,  # [M, topk]
    topk_ids: torch.Tensor,  # [M, topk]
) -> torch.Tensor:
    """y[t] = sum_j w[t,j] * w2[e_j] @ (silu(gate_e_j(x[t])) * up_e_j(x[t])), in float32. Returns [M, hidden]."""
    M, H = x.shape
    topk = topk_ids.shape[1]
    I = weights.w2.shape[2]
    xf = x.float()
    out = torch.zeros(M, H, device=x.device, dtype=torch.float32)
    flat = topk_ids.reshape(-1).long()  # [T]
    routed = topk_weights.reshape(-1).float()  # [T]
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=weights.w13.shape[0]).tolist()
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        slots = order[start : start + count]
        start += count
        tok = slots // topk
        w13 = _expert_weight(weights.w13, weights.w13_scale, weights.fp8_scheme, e)  # [2I, H]
        w2 = _expert_weight(weights.w2, weights.w2_scale, weights.fp8_scheme, e)  # [H, I]
        gate_up = xf[tok] @ w13.T  # [count, 2I]
        act = F.silu(gate_up[:, :I]) * gate_up[:, I:]  # [count, I]
        out.index_add_(0, tok, (act @ w2.T) * routed[slots, None])
    return out


class TorchReferencePath:
    name = "torch"
    baseline = True
    tunable = False
    graph_safe = False

    def supports(self, problem: Problem, target: Target) -> str | None:
        return None

    def prepare(self, inputs: MoEInputs, problem: Problem, config: TileConfig | None):
        def run(out: torch.Tensor) -> None:
            out.copy_(moe_reference(inputs.x, inputs.weights, inputs.topk_weights, inputs.topk_ids))

        return run
