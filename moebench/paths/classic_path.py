"""The engines' kernel form (vLLM's and SGLang's fused-MoE Triton kernel, written here) as a path.

Tables exported for an engine are tuned on this path: its tile config means what an engine's config file
means (``kernels/classic.py``), where moebench's own form (the "triton" path) tiles GEMM1 differently.
"""

from __future__ import annotations

import torch

from moebench.kernels.classic import check_config, classic_moe, default_config
from moebench.paths.base import Target, no_expert_map, triton_supports
from moebench.problem import MoEInputs, Problem
from moebench.tile import TileConfig


class ClassicPath:
    name = "triton-classic"
    baseline = False
    tunable = True
    graph_safe = True

    def supports(self, problem: Problem, target: Target) -> str | None:
        return no_expert_map(problem, "the engines' kernel form (triton-classic)") or triton_supports(problem, target)

    def default_config(self, problem: Problem) -> TileConfig:
        return default_config(problem.M, problem.shape.experts, problem.spec.fp8_scheme)

    def prepare(self, inputs: MoEInputs, problem: Problem, config: TileConfig | None):
        cfg = config or self.default_config(problem)
        w = inputs.weights
        check_config(cfg, w.fp8_scheme)  # refused here, once, not at the first launch

        def run(out: torch.Tensor) -> None:
            classic_moe(inputs.x, w.w13, w.w2, inputs.topk_weights, inputs.topk_ids, cfg, out=out,
                        fp8_scheme=w.fp8_scheme, w13_scale=w.w13_scale, w2_scale=w.w2_scale, act_scale=w.act_scale)

        return run
