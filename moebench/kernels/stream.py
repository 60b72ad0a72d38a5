"""Streaming-read kernels for the memory ceiling.

An MoE layer at decode mostly reads weights, and a read-only stream runs
faster than a copy (which turns the bus around for writes). Two shapes of
read are measured and the faster kept: a flat persistent-grid sum, and a
matrix read tile by tile through ``tl.dot`` (the access pattern of the MoE
GEMMs at decode, with the same software pipelining).
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


@triton.jit
def _read_rows(w_ptr, out_ptr, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    ptrs = w_ptr + rows[:, None].to(tl.int64) * C + tl.arange(0, BLOCK_C)[None, :]  # [BLOCK_R, BLOCK_C]
    ones = tl.full((16, BLOCK_C), 1.0, w_ptr.dtype.element_ty)
    acc = tl.zeros((16, BLOCK_R), dtype=tl.float32)
    for _ in range(0, C // BLOCK_C):
        acc = tl.dot(ones, tl.trans(tl.load(ptrs)), acc)
        ptrs += BLOCK_C
    tl.store(out_ptr + rows, tl.sum(acc, axis=0) / 16)


def read_rows(w: torch.Tensor, out: torch.Tensor, block_r: int = 64, block_c: int = 256) -> None:
    """Row sums of w [R, C] (R % block_r == 0, C % block_c == 0; 16-bit floats) into out [R], through tl.dot."""
    R, C = w.shape
    _read_rows[(R // block_r,)](w, out, C, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4, num_stages=4)
