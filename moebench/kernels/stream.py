"""A streaming-read kernel for the memory ceiling.

An MoE layer at decode mostly reads weights, and a read-only stream runs
faster than a copy (which turns the bus around for writes). This kernel reads
a large buffer once with a persistent grid and writes one float per program,
so its bytes / time is the read bandwidth a well-formed kernel can reach.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _read_all(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))


def read_all(x: torch.Tensor, partial: torch.Tensor, block: int = 4096, num_warps: int = 8) -> None:
    """Sum ``x`` (flat) into ``partial`` [programs]: one program per element of ``partial``."""
    _read_all[(partial.numel(),)](x, partial, x.numel(), BLOCK=block, num_warps=num_warps)
