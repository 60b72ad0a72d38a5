"""moebench's own Triton fused-MoE kernels as a path."""

from __future__ import annotations

import torch

from moebench.kernels.fused_moe import DeviceFacts, LayerShapes, fused_moe, launch_plan
from moebench.paths.base import Target, triton_supports
from moebench.problem import MoEInputs, Problem
from moebench.tile import TileConfig, default_config


class TritonPath:
    name = "triton"
    baseline = False
    tunable = True
    graph_safe = True

    def supports(self, problem: Problem, target: Target) -> str | None:
        return triton_supports(problem, target)

    def default_config(self, problem: Problem) -> TileConfig:
        s, spec = problem.shape, problem.spec  # sized by the slots per expert: per global one under an expert_map
        return default_config(problem.M, s.routed_experts, s.topk, spec.weight_bytes, spec.fp8_scheme)

    def prepare(self, inputs: MoEInputs, problem: Problem, config: TileConfig | None):
        cfg = config or self.default_config(problem)
        w = inputs.weights
        # A config the scheme or the shapes cannot run is refused here, once, not at the first launch.
        shapes = LayerShapes.of(inputs.x, w.w13, inputs.topk_ids, act_scale=w.act_scale,
                                remote_slots=inputs.expert_map is not None)
        launch_plan(cfg, w.fp8_scheme, shapes, DeviceFacts.of(inputs.x.device))

        def run(out: torch.Tensor) -> None:
            fused_moe(inputs.x, w.w13, w.w2, inputs.topk_weights, inputs.topk_ids, cfg, out=out,
                      fp8_scheme=w.fp8_scheme, w13_scale=w.w13_scale, w2_scale=w.w2_scale, act_scale=w.act_scale,
                      expert_map=inputs.expert_map)

        return run
