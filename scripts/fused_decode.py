"""An experiment, not a kernel of the layer: the whole MoE layer in one launch at decode, both GEMMs'
weights streamed at once. Measured by ``scripts/fused_decode_ab.py``, slower than the layer's launches
(``results/h200-session30``).

At decode the layer reads its routed experts' weights and does little else, and every launch boundary
costs a ramp-down and a ramp-up of that read. Here one launch holds two kinds of program:

- **GEMM1 programs** (the first ``M * topk * I / BLOCK_I`` tickets): a slot's ``BLOCK_I`` columns of
  ``h = silu(x W_gate^T) * (x W_up^T)`` times the routed weight, over all of the hidden dimension, written
  in float32 to a small buffer ``[M * topk, I]``; then the token's counter is raised (release).
- **GEMM2 programs** (the other ``M * H / BLOCK_N`` tickets): a token's ``BLOCK_N`` output columns over
  all its top-k slots. Each first reads its whole share of W2 (``[topk, BLOCK_N, I]``) into registers,
  then waits until its token's counter says all of h is written (acquire), then reduces over the slots and
  I and stores the output: no atomics into the output, no top-k sum pass.

So W2's bytes are read while GEMM1 runs, and the only serial step left is GEMM2's arithmetic on weights it
already holds. A program takes its role from an atomic ticket, not its program id: a GEMM2 program waits
only for tickets handed out before its own, whose programs are running, so the wait cannot deadlock
whatever order the hardware starts programs in. The last program to finish sets the tickets and counters
back to zero for the next call (the sync buffer is zeroed once, when allocated).

GEMM2 runs on the CUDA cores in float32, and GEMM1 there too (``dot=False``: x not quantized, the weight
scales, per tensor or 128x128 blocks, multiplying x's K step) or by ``tl.dot`` (``dot=True``: the weight tile
times x's row as the first of 16 columns; at fp8-block128 x's 1x128 group quantized in the K loop).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moebench._interpret import interpreting
from moebench.kernels.act_quant import quantize_groups_of
from moebench.quant import BLOCK

SCALE_NONE, SCALE_TENSOR, SCALE_BLOCK = 0, 1, 2
_SCALE = {None: SCALE_NONE, "tensor": SCALE_TENSOR, "block128": SCALE_BLOCK}
SCALE_SIDE = tl.constexpr(128)  # the side of a block128 weight-scale block
SYNC_HEAD = 2  # the sync buffer: [ticket, programs done, one counter per token...]


@triton.jit
def _gemm1_share(ticket, x_ptr, w13_ptr, s13_ptr, s2_ptr, ids_ptr, tw_ptr, h_ptr, count_ptr, H, I,
                 TOPK: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr, SCALE: tl.constexpr,
                 PREFETCH: tl.constexpr, DOT: tl.constexpr, ROUND_FIRST: tl.constexpr):
    """h[slot, cols] for the slot and column chunk of ``ticket``, then the token's counter raised."""
    chunks = I // BLOCK_I
    slot = ticket // chunks
    chunk = ticket % chunks
    tok = slot // TOPK
    expert = tl.load(ids_ptr + slot).to(tl.int64)
    cols = chunk * BLOCK_I + tl.arange(0, BLOCK_I)  # [BLOCK_I] columns of h
    offs_k = tl.arange(0, BLOCK_K)
    gate_ptrs = w13_ptr + expert * 2 * I * H + cols[:, None].to(tl.int64) * H + offs_k[None, :]  # [BLOCK_I, BLOCK_K]
    up_ptrs = gate_ptrs + I * H
    x_ptrs = x_ptr + tok * H + offs_k  # [BLOCK_K]
    k_blocks = tl.cdiv(H, SCALE_SIDE)
    s_gate_ptr = s13_ptr + (expert * tl.cdiv(2 * I, SCALE_SIDE) + chunk * BLOCK_I // SCALE_SIDE) * k_blocks
    s_up_ptr = s_gate_ptr + I // SCALE_SIDE * k_blocks  # I % 128 == 0 where SCALE == SCALE_BLOCK

    if DOT:
        g, u = _gemm1_mma(x_ptr, gate_ptrs, up_ptrs, s_gate_ptr, s_up_ptr, tok, H, offs_k, BLOCK_I, BLOCK_K, SCALE,
                          ROUND_FIRST)
    else:
        g = tl.zeros((BLOCK_I,), tl.float32)
        u = tl.zeros((BLOCK_I,), tl.float32)
        w_gate = tl.load(gate_ptrs)
        w_up = tl.load(up_ptrs)
        for k in range(0, H, BLOCK_K):
            more = (k + BLOCK_K + offs_k < H)[None, :]  # the next step's mask: all false at the last step
            if PREFETCH:  # the next step's weights requested before this step's arithmetic
                next_gate = tl.load(gate_ptrs + k + BLOCK_K, mask=more, other=0.0)
                next_up = tl.load(up_ptrs + k + BLOCK_K, mask=more, other=0.0)
            xk = tl.load(x_ptrs + k).to(tl.float32)  # [BLOCK_K]
            if SCALE == 2:
                k_block = (k + offs_k) // SCALE_SIDE
                x_gate = xk * tl.load(s_gate_ptr + k_block)
                x_up = xk * tl.load(s_up_ptr + k_block)
            else:
                x_gate = xk
                x_up = xk
            g += tl.sum(w_gate.to(tl.float32) * x_gate[None, :], axis=1)
            u += tl.sum(w_up.to(tl.float32) * x_up[None, :], axis=1)
            if PREFETCH:
                w_gate = next_gate
                w_up = next_up
            else:
                w_gate = tl.load(gate_ptrs + k + BLOCK_K, mask=more, other=0.0)
                w_up = tl.load(up_ptrs + k + BLOCK_K, mask=more, other=0.0)
    if SCALE == 1:
        s13 = tl.load(s13_ptr + expert)
        g *= s13
        u *= s13
    h = g / (1.0 + tl.exp(-g)) * u * tl.load(tw_ptr + slot)  # the routed weight applied here, once
    if SCALE == 1:
        h *= tl.load(s2_ptr + expert)
    tl.store(h_ptr + slot * I + cols, h)
    tl.debug_barrier()  # every thread's h stored before the release below
    tl.atomic_add(count_ptr + tok, 1, sem="release")


@triton.jit
def _gemm1_mma(x_ptr, gate_ptrs, up_ptrs, s_gate_ptr, s_up_ptr, tok, H, offs_k, BLOCK_I: tl.constexpr,
               BLOCK_K: tl.constexpr, SCALE: tl.constexpr, ROUND_FIRST: tl.constexpr):
    """GEMM1's gate and up columns [BLOCK_I] by the tensor cores: the weight tiles times x's row as the first
    of 16 columns (Swap-AB); at fp8-block128 x's 1x128 group quantized here (BLOCK_K == 128)."""
    col = tl.arange(0, 16)
    first = (col == 0)[None, :]  # [1, 16]
    xt_ptrs = x_ptr + tok * H + offs_k[:, None] + col[None, :] * 0  # [BLOCK_K, 16]
    acc_g = tl.zeros((BLOCK_I, 16), tl.float32)
    acc_u = tl.zeros((BLOCK_I, 16), tl.float32)
    for k in range(0, H, BLOCK_K):
        xt = tl.load(xt_ptrs + k, mask=first, other=0.0)
        w_gate = tl.load(gate_ptrs + k)
        w_up = tl.load(up_ptrs + k)
        if SCALE == 2:
            xq, xs = quantize_groups_of(xt.to(tl.float32), 0, w_gate.dtype, ROUND_FIRST)  # xs [16]
            acc_g += tl.dot(w_gate, xq) * (tl.load(s_gate_ptr + k // BLOCK_K) * xs)[None, :]
            acc_u += tl.dot(w_up, xq) * (tl.load(s_up_ptr + k // BLOCK_K) * xs)[None, :]
        else:
            acc_g = tl.dot(w_gate, xt.to(w_gate.dtype), acc_g)
            acc_u = tl.dot(w_up, xt.to(w_up.dtype), acc_u)
    return tl.sum(tl.where(first, acc_g, 0.0), axis=1), tl.sum(tl.where(first, acc_u, 0.0), axis=1)


@triton.jit
def _gemm2_share(ticket, w2_ptr, s2_ptr, ids_ptr, h_ptr, count_ptr, out_ptr, H, I, TOPK: tl.constexpr,
                 BLOCK_N: tl.constexpr, I_PAD: tl.constexpr, BLOCK_I: tl.constexpr, SCALE: tl.constexpr):
    """out[tok, cols] for the token and column tile of ``ticket`` (counted from the first GEMM2 ticket)."""
    n_tiles = H // BLOCK_N
    tok = ticket // n_tiles
    first = (ticket % n_tiles) * BLOCK_N
    cols = first + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    slots = tok * TOPK + tl.arange(0, TOPK)  # [TOPK]
    experts = tl.load(ids_ptr + slots).to(tl.int64)
    offs_i = tl.arange(0, I_PAD)
    i_ok = offs_i < I
    w2_ptrs = (w2_ptr + experts[:, None, None] * H * I + cols[None, :, None].to(tl.int64) * I
               + offs_i[None, None, :])  # [TOPK, BLOCK_N, I_PAD]
    w2 = tl.load(w2_ptrs, mask=i_ok[None, None, :], other=0.0)  # read before the wait: it overlaps GEMM1

    target = TOPK * (I // BLOCK_I)  # h chunks of one token
    seen = 0
    while seen < target:
        seen = tl.atomic_add(count_ptr + tok, 0, sem="acquire")
    tl.debug_barrier()
    hp = h_ptr + slots[:, None] * I + offs_i[None, :]  # [TOPK, I_PAD]
    h = tl.load(hp, mask=i_ok[None, :], other=0.0, cache_modifier=".cg")
    if SCALE == 2:  # the tile's rows lie in one 128-row block of W2 (BLOCK_N divides 128)
        i_blocks = tl.cdiv(I, SCALE_SIDE)
        n_block = first // SCALE_SIDE
        sp = s2_ptr + (experts[:, None] * tl.cdiv(H, SCALE_SIDE) + n_block) * i_blocks + offs_i[None, :] // SCALE_SIDE
        h *= tl.load(sp, mask=i_ok[None, :], other=0.0)
    y = tl.sum(tl.sum(w2.to(tl.float32) * h[:, None, :], axis=2), axis=0)  # [BLOCK_N]
    tl.store(out_ptr + tok * H + cols, y.to(out_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["num_tokens"])
def _decode_layer(
    x_ptr,  # [M, H]
    w13_ptr,  # [E, 2I, H]: gate rows, then up rows
    w2_ptr,  # [E, H, I]
    s13_ptr,  # SCALE_TENSOR: [E]; SCALE_BLOCK: [E, 2I/128, H/128]
    s2_ptr,  # SCALE_TENSOR: [E]; SCALE_BLOCK: [E, H/128, I/128]
    ids_ptr,  # [M * topk] int32 expert per slot
    tw_ptr,  # [M * topk] float32 routed weight per slot
    out_ptr,  # [M, H]
    h_ptr,  # [M * topk, I] float32
    sync_ptr,  # [SYNC_HEAD + M] int32, zero on entry and on exit
    num_tokens,
    H,
    I,
    TOPK: tl.constexpr,
    BLOCK_I: tl.constexpr,  # GEMM1: columns of h per program; divides I (and 128 at fp8-block128)
    BLOCK_K: tl.constexpr,  # GEMM1: K step over H; divides H
    BLOCK_N: tl.constexpr,  # GEMM2: output columns per program; divides H (and 128 at fp8-block128)
    I_PAD: tl.constexpr,  # I rounded up to a power of two
    SCALE: tl.constexpr,
    PREFETCH: tl.constexpr,  # GEMM1 holds two K steps of weights in flight (CUDA-core form)
    DOT: tl.constexpr,  # GEMM1 by tl.dot (tensor cores), not on the CUDA cores
    ROUND_FIRST: tl.constexpr,  # under the interpreter: act_quant.to_fp8's rounding
):
    gemm1_programs = num_tokens * TOPK * (I // BLOCK_I)
    programs = gemm1_programs + num_tokens * (H // BLOCK_N)
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    count_ptr = sync_ptr + 2  # past the head of SYNC_HEAD entries
    if ticket < gemm1_programs:
        _gemm1_share(ticket, x_ptr, w13_ptr, s13_ptr, s2_ptr, ids_ptr, tw_ptr, h_ptr, count_ptr, H, I, TOPK,
                     BLOCK_I, BLOCK_K, SCALE, PREFETCH, DOT, ROUND_FIRST)
    else:
        _gemm2_share(ticket - gemm1_programs, w2_ptr, s2_ptr, ids_ptr, h_ptr, count_ptr, out_ptr, H, I, TOPK,
                     BLOCK_N, I_PAD, BLOCK_I, SCALE)
    tl.debug_barrier()
    if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel") == programs - 1:  # the last program: reset for the next call
        tl.store(sync_ptr, 0)
        tl.store(sync_ptr + 1, 0)
        for t in range(0, num_tokens):
            tl.store(count_ptr + t, 0)


_SYNC: dict[torch.device, torch.Tensor] = {}


def sync_buffer(device: torch.device, tokens: int) -> torch.Tensor:
    """The zeroed sync buffer of ``device`` for up to ``tokens`` tokens (allocated once, grown as needed;
    every call leaves it zero)."""
    buf = _SYNC.get(device)
    if buf is None or buf.numel() < SYNC_HEAD + tokens:
        buf = _SYNC[device] = torch.zeros(SYNC_HEAD + max(tokens, 64), device=device, dtype=torch.int32)
    return buf


def fused_decode(
    x: torch.Tensor,  # [M, H]
    w13: torch.Tensor,  # [E, 2I, H]
    w2: torch.Tensor,  # [E, H, I]
    topk_weights: torch.Tensor,  # [M, topk] float32
    topk_ids: torch.Tensor,  # [M, topk] int32
    out: torch.Tensor,  # [M, H]
    fp8_scheme: str | None = None,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    block_i: int = 16,
    block_k: int = 256,
    block_n: int = 16,
    num_warps: int = 4,
    prefetch: bool = True,
    dot: bool = False,
    num_stages: int = 1,
) -> torch.Tensor:
    """The layer into ``out`` [M, H] in one launch. Returns ``out``."""
    M, H = x.shape
    E, two_i, _ = w13.shape
    I = two_i // 2
    topk = topk_ids.shape[1]
    if topk & (topk - 1):
        raise ValueError(f"fused decode needs a power-of-two top-k, got {topk}")
    if fp8_scheme not in _SCALE:
        raise ValueError(f"fused decode has no fp8 scheme {fp8_scheme!r}")
    if I % block_i or H % block_k or H % block_n:
        raise ValueError(f"tile I/{block_i} K/{block_k} N/{block_n} does not divide I={I} or H={H}")
    if fp8_scheme == "block128" and (I % BLOCK or BLOCK % block_i or BLOCK % block_n):
        raise ValueError(f"fused decode at fp8-block128 needs I % 128 == 0 and tiles dividing 128, got I={I}")
    if dot and (fp8_scheme == "tensor" or fp8_scheme == "block128" and block_k != BLOCK or block_i < 16):
        raise ValueError("GEMM1 by tl.dot takes no fp8-tensor, 128-deep K steps at fp8-block128, block_i >= 16")
    h = torch.empty(M * topk, I, device=x.device, dtype=torch.float32)
    sync = sync_buffer(x.device, M)
    dummy = topk_weights  # any tensor: the scale pointers are not read without a scheme
    grid = (M * topk * (I // block_i) + M * (H // block_n),)
    _decode_layer[grid](
        x, w13, w2, dummy if w13_scale is None else w13_scale, dummy if w2_scale is None else w2_scale,
        topk_ids, topk_weights, out, h, sync, M, H, I,
        TOPK=topk, BLOCK_I=block_i, BLOCK_K=block_k, BLOCK_N=block_n, I_PAD=triton.next_power_of_2(I),
        SCALE=_SCALE[fp8_scheme], PREFETCH=prefetch, DOT=dot, ROUND_FIRST=interpreting(),
        num_warps=num_warps, num_stages=num_stages)
    return out
