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


def _expert_weight(w: torch.Tensor, scale: torch.Tensor | None, weights: Weights, e: int) -> torch.Tensor:
    return dequantize_weight(w[e], None if scale is None else scale[e], weights.fp8_scheme, weights.block_shape)


def moe_reference(
    x: torch.Tensor,  # [M, hidden]
    weights: Weights,
    topk_weights: torch.Tensor,  # [M, topk]
    topk_ids: torch.Tensor,  # [M, topk]
    *,
    expert_map: torch.Tensor | None = None,  # [global experts]: local expert of each global id, -1 elsewhere
    apply_router_weight_on_input: bool = False,
) -> torch.Tensor:
    """y[t] = sum_j w[t,j] * w2[e_j] @ (silu(gate_e_j(x[t])) * up_e_j(x[t])), in float32. Returns [M, hidden].

    With ``expert_map`` the ids are global and e_j = expert_map[id]; slots of -1 add nothing. With
    ``apply_router_weight_on_input`` the weight multiplies x[t] instead: w2[e_j] @ (silu(gate(w x)) * up(w x))."""
    M, H = x.shape
    topk = topk_ids.shape[1]
    I = weights.w2.shape[2]
    xf = x.float()
    out = torch.zeros(M, H, device=x.device, dtype=torch.float32)
    flat = topk_ids.reshape(-1).long()  # [T]
    if expert_map is not None:
        flat = expert_map.long()[flat]  # [T] local experts, -1 for other ranks'
    routed = topk_weights.reshape(-1).float()  # [T]
    local = (flat >= 0).nonzero().flatten()  # [T_local] slots of local experts
    order = local[torch.argsort(flat[local], stable=True)]
    counts = torch.bincount(flat[local], minlength=weights.w13.shape[0]).tolist()
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        slots = order[start : start + count]
        start += count
        tok = slots // topk
        w13 = _expert_weight(weights.w13, weights.w13_scale, weights, e)  # [2I, H]
        w2 = _expert_weight(weights.w2, weights.w2_scale, weights, e)  # [H, I]
        on_input = routed[slots, None] if apply_router_weight_on_input else 1.0
        gate_up = (xf[tok] * on_input) @ w13.T  # [count, 2I]
        act = F.silu(gate_up[:, :I]) * gate_up[:, I:]  # [count, I]
        out.index_add_(0, tok, (act @ w2.T) * (1.0 if apply_router_weight_on_input else routed[slots, None]))
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
            out.copy_(moe_reference(inputs.x, inputs.weights, inputs.topk_weights, inputs.topk_ids,
                                    expert_map=inputs.expert_map))

        return run
