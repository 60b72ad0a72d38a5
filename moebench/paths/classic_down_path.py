"""The engines' kernel form with the tile config on GEMM2 alone, as SGLang runs a ``_down`` table.

SGLang 0.5.23 (``moe_runner/triton_utils/fused_moe_triton_config.py``, ``try_get_optimal_moe_config``) reads a
second file, the name of the first with ``_down``, and runs its entry nearest M on GEMM2 (the down projection),
its ``BLOCK_SIZE_M`` set to GEMM1's (both GEMMs read one align); GEMM1 runs the first file's entry. This path
times such an entry: GEMM2 at the given config, GEMM1 at the engines' untuned default, whose ``BLOCK_SIZE_M``
both take. Its default is the default on both GEMMs, as SGLang runs GEMM2 where no ``_down`` file is found.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from moebench.kernels.classic import check_config, classic_moe
from moebench.paths.classic_path import ClassicPath
from moebench.problem import MoEInputs, Problem
from moebench.tile import TileConfig


def down_config(gemm1: TileConfig, gemm2: TileConfig) -> TileConfig:
    """``gemm2`` as SGLang runs it after ``gemm1``: ``BLOCK_SIZE_M`` GEMM1's (an engine file's entry holds the six
    keys alone, and keeps its class: a ``tables.engine_entry.EngineTile`` stays one)."""
    return replace(gemm2, BLOCK_SIZE_M=gemm1.BLOCK_SIZE_M)


class ClassicDownPath(ClassicPath):
    name = "triton-classic-down"  # tables.table.ENGINE_DOWN_PATH: the path a _down table is timed on

    def prepare(self, inputs: MoEInputs, problem: Problem, config: TileConfig | None):
        gemm1 = self.default_config(problem)
        w = inputs.weights
        check_config(config or gemm1, w.fp8_scheme)  # the config as given: refused here, once
        gemm2 = down_config(gemm1, config or gemm1)
        check_config(gemm2, w.fp8_scheme)

        def run(out: torch.Tensor) -> None:
            classic_moe(inputs.x, w.w13, w.w2, inputs.topk_weights, inputs.topk_ids, gemm1, out=out,
                        fp8_scheme=w.fp8_scheme, w13_scale=w.w13_scale, w2_scale=w.w2_scale, act_scale=w.act_scale,
                        down_config=gemm2)

        return run
