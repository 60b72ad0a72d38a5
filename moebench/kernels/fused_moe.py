"""Fused-MoE grouped GEMMs in Triton (BF16 / FP16 / FP32 weights).

The layer is split in two launches after the align step:

1. ``_gemm1_swiglu``: for a tile of token slots of one expert, ``x @ w13[e].T``
   with the gate and up halves accumulated side by side, and
   ``silu(gate) * up`` applied in the epilogue; only the ``[T, I]`` activation
   is written (the ``[T, 2I]`` GEMM output never reaches memory).
2. ``_gemm2_combine``: ``h @ w2[e].T`` for the same tiles, scaled by each slot's
   routed weight and added into the float32 ``[M, hidden]`` output with
   atomics: the top-k reduction happens in the epilogue, with no separate
   sum pass.

Why two launches and not one: GEMM2 needs the whole ``I``-long row of the
activation, which GEMM1 spreads over ``cdiv(I, BLOCK_N)`` programs; fusing them
would need a grid-wide barrier or recomputation.

Token counts are never compile-time constants: ``num_slots`` is declared
``do_not_specialize`` and the grid is sized from shapes alone (an upper bound
on padded blocks), so a stream of changing ``M`` reuses one compiled kernel
per tile config. Programs past the real padded length exit at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moebench.routing import max_padded_len, moe_align
from moebench.tile import TileConfig


@triton.jit
def _tile_coords(num_padded_ptr, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Map this program to (pid_m, pid_n), grouping GROUP_M row tiles for weight reuse in L2.

    Only the first cdiv(num_padded, BLOCK_M) * cdiv(N, BLOCK_N) programs get a
    tile; the rest return valid=False (the grid is sized for the worst case).
    """
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(tl.load(num_padded_ptr), BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    group_rows = tl.maximum(group_rows, 1)  # keeps the modulo defined for idle programs
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    return pid_m, pid_n, pid < num_pid_m * num_pid_n


@triton.jit(do_not_specialize=["num_slots"])
def _gemm1_swiglu(
    x_ptr,  # [M, K] activations
    w_ptr,  # [E, 2N, K] gate rows then up rows
    h_ptr,  # [T, N] output activation, row = token slot
    sorted_ids_ptr,  # [max_padded] slot ids grouped by expert; == num_slots for padding
    expert_ids_ptr,  # [max_blocks]
    num_padded_ptr,  # [1]
    num_slots,  # T = M * topk
    N,  # I
    K,  # hidden
    stride_xm,
    stride_we,
    stride_wn,
    stride_hm,
    TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid_m, pid_n, valid = _tile_coords(num_padded_ptr, N, BLOCK_M, BLOCK_N, GROUP_M)
    if valid:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        slot = tl.load(sorted_ids_ptr + offs_m)  # [BLOCK_M]
        row_ok = slot < num_slots
        tok = tl.where(row_ok, slot // TOPK, 0).to(tl.int64)
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)

        a_ptrs = x_ptr + tok[:, None] * stride_xm + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
        g_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]  # [BLOCK_K, BLOCK_N]
        u_ptrs = g_ptrs + N * stride_wn
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_ok = offs_k < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc_g = tl.dot(a, g, acc_g)
            acc_u = tl.dot(a, u, acc_u)
            a_ptrs += BLOCK_K
            g_ptrs += BLOCK_K
            u_ptrs += BLOCK_K

        h = acc_g * tl.sigmoid(acc_g) * acc_u  # silu(gate) * up
        slot_safe = tl.where(row_ok, slot, 0).to(tl.int64)
        h_ptrs = h_ptr + slot_safe[:, None] * stride_hm + offs_n[None, :]
        tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["num_slots"])
def _gemm2_combine(
    h_ptr,  # [T, K] activation from GEMM1
    w_ptr,  # [E, N, K]
    out_ptr,  # [M, N] float32, zeroed; slots of one token add into one row
    topk_weights_ptr,  # [T] float32 routed weights, row-major [M, topk]
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    num_slots,
    N,  # hidden
    K,  # I
    stride_hm,
    stride_we,
    stride_wn,
    stride_om,
    TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid_m, pid_n, valid = _tile_coords(num_padded_ptr, N, BLOCK_M, BLOCK_N, GROUP_M)
    if valid:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        slot = tl.load(sorted_ids_ptr + offs_m)  # [BLOCK_M]
        row_ok = slot < num_slots
        slot_safe = tl.where(row_ok, slot, 0).to(tl.int64)
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)

        a_ptrs = h_ptr + slot_safe[:, None] * stride_hm + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
        b_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]  # [BLOCK_K, BLOCK_N]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_ok = offs_k < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K

        routed = tl.load(topk_weights_ptr + slot_safe, mask=row_ok, other=0.0)  # [BLOCK_M]
        acc = acc * routed[:, None]
        tok = slot_safe // TOPK
        out_ptrs = out_ptr + tok[:, None] * stride_om + offs_n[None, :]
        tl.atomic_add(out_ptrs, acc, mask=row_ok[:, None] & n_ok[None, :])


def _launch_args(cfg: TileConfig) -> dict:
    return dict(
        BLOCK_M=cfg.BLOCK_SIZE_M,
        BLOCK_N=cfg.BLOCK_SIZE_N,
        BLOCK_K=cfg.BLOCK_SIZE_K,
        GROUP_M=cfg.GROUP_SIZE_M,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def fused_moe(
    x: torch.Tensor,  # [M, hidden]
    w13: torch.Tensor,  # [E, 2I, hidden]
    w2: torch.Tensor,  # [E, hidden, I]
    topk_weights: torch.Tensor,  # [M, topk] float32
    topk_ids: torch.Tensor,  # [M, topk] int32
    config: TileConfig,
    out: torch.Tensor | None = None,  # [M, hidden], x's dtype
) -> torch.Tensor:
    """The whole MoE layer from routed tokens to the output, with no host synchronization."""
    M, H = x.shape
    E, two_i, _ = w13.shape
    I = two_i // 2
    topk = topk_ids.shape[1]
    T = M * topk
    assert x.stride(1) == 1 and w13.stride(2) == 1 and w2.stride(2) == 1, "last dims must be contiguous"
    assert topk_weights.is_contiguous() and topk_weights.dtype == torch.float32
    bm = config.BLOCK_SIZE_M

    align = moe_align(topk_ids, E, bm)
    max_blocks = max_padded_len(T, E, bm) // bm

    h = torch.empty(T, I, device=x.device, dtype=x.dtype)  # [T, I]
    grid1 = (max_blocks * triton.cdiv(I, config.BLOCK_SIZE_N),)
    _gemm1_swiglu[grid1](
        x, w13, h, align.sorted_ids, align.expert_ids, align.num_padded,
        T, I, H, x.stride(0), w13.stride(0), w13.stride(1), h.stride(0),
        TOPK=topk, **_launch_args(config),
    )

    if out is None:
        out = torch.empty(M, H, device=x.device, dtype=x.dtype)
    acc = out if out.dtype == torch.float32 else torch.empty(M, H, device=x.device, dtype=torch.float32)
    acc.zero_()
    grid2 = (max_blocks * triton.cdiv(H, config.BLOCK_SIZE_N),)
    _gemm2_combine[grid2](
        h, w2, acc, topk_weights, align.sorted_ids, align.expert_ids, align.num_padded,
        T, H, I, h.stride(0), w2.stride(0), w2.stride(1), acc.stride(0),
        TOPK=topk, **_launch_args(config),
    )
    if acc is not out:
        out.copy_(acc)
    return out
