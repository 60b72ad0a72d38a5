"""Which matrix instructions the compiled fused-MoE kernels use (PTX and SASS).

On Hopper the tensor-core path is ``wgmma.mma_async`` in PTX, ``HGMMA`` (16-bit)
or ``QGMMA`` (fp8) in SASS; ``mma.sync`` / ``HMMA`` is the older, slower path.
This compiles the two GEMMs for a problem and tile configs and counts them,
with the registers per thread and the spills the compiler reports.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from moebench.errors import UserError
from moebench.kernels.fused_moe import fused_moe
from moebench.problem import Problem, make_inputs
from moebench.tile import TileConfig

OPS = (("ptx", "wgmma.mma_async"), ("ptx", "mma.sync"), ("sass", "HGMMA"), ("sass", "QGMMA"), ("sass", "HMMA"))


def _count(kernel, kind: str, op: str) -> int | None:
    try:
        text = kernel.asm[kind]
    except Exception:  # no disassembler (cuobjdump) on this machine: say unknown, not zero
        return None
    return text.count(op)


def matrix_instructions(problem: Problem, configs: list[TileConfig]) -> list[dict]:
    """One row per (config, kernel): the config's short label (``tile.short_label``), the count of each matrix
    instruction in its PTX and SASS, and the registers and spills per thread."""
    if not torch.cuda.is_available():
        raise UserError("isa needs a CUDA GPU: the interpreter compiles nothing")
    s = problem.shape
    small = replace(s, experts=max(s.topk, 8))  # the expert count is not compiled into the kernels
    inputs = make_inputs(replace(problem, shape=small), "cuda")
    w = inputs.weights
    rows = []
    for cfg in configs:
        kernels: list = []
        fused_moe(inputs.x, w.w13, w.w2, inputs.topk_weights, inputs.topk_ids, cfg, fp8_scheme=w.fp8_scheme,
                  w13_scale=w.w13_scale, w2_scale=w.w2_scale, compiled=kernels)
        for name, k in zip(("gemm1_swiglu", "gemm2_combine"), kernels):
            row = {"kernel": name, "config": cfg.label}  # every field away from its default, by its mark
            row.update({f"{kind}:{op}": _count(k, kind, op) for kind, op in OPS})
            row.update(regs=getattr(k, "n_regs", None), spills=getattr(k, "n_spills", None))
            rows.append(row)
    return rows
