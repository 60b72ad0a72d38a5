"""Dynamic FP8 (e4m3) quantization of activations, with no host synchronization.

Rows are tokens (GEMM1's input ``x [M, K]``) or token slots (GEMM2's input
``h [T, I]``). The three granularities match the weight schemes:

- ``tensor``:   one scale for the whole tensor -> scale ``[1]``
- ``channel``:  one scale per row (per token)  -> scale ``[R]``
- ``block128``: one scale per 1 x ``group`` group (128 unless given) -> scale ``[R, cdiv(K, group)]``

``tensor`` and ``channel`` take two launches (row maxima, then quantize; for
``tensor`` every program reduces the row maxima itself, so no global barrier
or host sync is needed); ``block128`` takes one, a program per 32 rows x 128
columns. A ``tensor`` scale given ahead (static) takes one launch and no maxima,
and so does one whose maxima the GEMM that wrote the tensor gave (GEMM1 writes
the maximum of each tile of h it stores: no launch reads h for its maximum).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moebench._interpret import interpreting
from moebench.kernels import pdl as dependent

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
GROUP = 128
# Rows per block128 program: with one 128-wide group of one row per program, a prefill-sized h would take
# hundreds of thousands of programs of 256 bytes each.
GROUP_ROWS = 32


@triton.jit
def to_fp8(v, dtype, ROUND_FIRST: tl.constexpr):
    """Cast float32 ``v`` (already within +-448) to e4m3.

    The Triton interpreter's float32 -> fp8 cast drops the carry when rounding crosses a
    power of two (126.0 becomes 64.0). Under the interpreter the value is first rounded
    to e4m3's 3 mantissa bits in float32, so the cast is exact; GPUs cast natively.
    """
    if ROUND_FIRST:
        exponent = tl.floor(tl.log2(tl.maximum(tl.abs(v), 0.015625)))  # subnormals below 2^-6
        quantum = tl.exp2(exponent - 3.0)
        t = v / quantum
        r = tl.floor(t + 0.5)
        odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
        r = tl.where(((r - t) == 0.5) & odd, r - 1.0, r)  # ties to even, as the hardware cast rounds
        v = r * quantum
    return v.to(dtype)


@triton.jit
def quantize_groups_of(v, AXIS: tl.constexpr, fp8_dtype, ROUND_FIRST: tl.constexpr):
    """float32 tile ``v`` in fp8 with one scale per group, a group being v's elements along ``AXIS`` (a 1x128
    group per row with AXIS=1, per column with 0): (the fp8 tile, the scales). Every 1x128-group quantization
    of the layer (this module's launch, and the GEMMs that quantize x or h themselves) is this arithmetic, so
    they give the same bits."""
    scale = tl.maximum(tl.max(tl.abs(v), axis=AXIS), 1e-12) / 448.0
    q = to_fp8(tl.minimum(tl.maximum(v / tl.expand_dims(scale, AXIS), -448.0), 448.0), fp8_dtype, ROUND_FIRST)
    return q, scale


@triton.jit
def _row_amax(x_ptr, amax_ptr, K, stride_x, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    dependent.start(PDL)
    row = tl.program_id(0).to(tl.int64)
    m = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs = k + tl.arange(0, BLOCK_K)
        v = tl.load(x_ptr + row * stride_x + offs, mask=offs < K, other=0.0).to(tl.float32)
        m = tl.maximum(m, tl.abs(v))
    tl.store(amax_ptr + row, tl.max(m, axis=0))


@triton.jit(do_not_specialize=["n_amax"])
def _quantize_rows(x_ptr, q_ptr, amax_ptr, scale_ptr, n_amax, K, stride_x, stride_q,
                   PER_TENSOR: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
                   ROUND_FIRST: tl.constexpr, STATIC: tl.constexpr = False, PDL: tl.constexpr = False):
    """Row ``program_id`` of x in fp8. STATIC: the scale is read from ``scale_ptr`` (given ahead). PER_TENSOR:
    the scale of the ``n_amax`` maxima at ``amax_ptr`` (x's rows', or those of the parts of x a GEMM wrote)."""
    dependent.start(PDL)
    row = tl.program_id(0).to(tl.int64)
    if STATIC:
        scale = tl.load(scale_ptr)
    else:
        if PER_TENSOR:  # every program reduces all row maxima: no second launch, no atomics
            m = tl.zeros((BLOCK_R,), dtype=tl.float32)
            for r in range(0, n_amax, BLOCK_R):
                offs_r = r + tl.arange(0, BLOCK_R)
                m = tl.maximum(m, tl.load(amax_ptr + offs_r, mask=offs_r < n_amax, other=0.0))
            amax = tl.max(m, axis=0)
        else:
            amax = tl.load(amax_ptr + row)
        scale = tl.maximum(amax, 1e-12) / 448.0
        if PER_TENSOR:
            if row == 0:
                tl.store(scale_ptr, scale)
        else:
            tl.store(scale_ptr + row, scale)
    for k in range(0, K, BLOCK_K):
        offs = k + tl.arange(0, BLOCK_K)
        v = tl.load(x_ptr + row * stride_x + offs, mask=offs < K, other=0.0).to(tl.float32)
        q = to_fp8(tl.minimum(tl.maximum(v / scale, -448.0), 448.0), q_ptr.dtype.element_ty, ROUND_FIRST)
        tl.store(q_ptr + row * stride_q + offs, q, mask=offs < K)


@triton.jit(do_not_specialize=["R"])
def _quantize_groups(x_ptr, q_ptr, scale_ptr, R, K, stride_x, stride_q, stride_s, BLOCK_R: tl.constexpr,
                     GROUP_K: tl.constexpr, ROUND_FIRST: tl.constexpr, PDL: tl.constexpr = False,
                     zero_ptr=None, stride_z=0, ZERO: tl.constexpr = False):
    """Grid (cdiv(R, BLOCK_R), cdiv(K, GROUP_K)): one [BLOCK_R, GROUP_K] tile, one scale per row of it.
    ZERO: the same tile of ``zero_ptr`` [R, K] set to zero too."""
    dependent.start(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    g = tl.program_id(1)
    cols = g * GROUP_K + tl.arange(0, GROUP_K)  # [GROUP_K]
    row_ok = rows < R
    ok = row_ok[:, None] & (cols < K)[None, :]
    r64 = rows.to(tl.int64)
    v = tl.load(x_ptr + r64[:, None] * stride_x + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    q, scale = quantize_groups_of(v, 1, q_ptr.dtype.element_ty, ROUND_FIRST)  # scale [BLOCK_R]
    tl.store(q_ptr + r64[:, None] * stride_q + cols[None, :], q, mask=ok)
    tl.store(scale_ptr + r64 * stride_s + g, scale, mask=row_ok)
    if ZERO:
        tl.store(zero_ptr + r64[:, None] * stride_z + cols[None, :], tl.zeros_like(v).to(zero_ptr.dtype.element_ty),
                 mask=ok)


def quantize_act(x: torch.Tensor, scheme: str, static_scale: torch.Tensor | None = None,
                 pdl: bool = False, maxima: torch.Tensor | None = None,
                 zero: torch.Tensor | None = None, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, K] (bf16/fp16/fp32) -> (fp8 [R, K], float32 scale shaped as the module doc says).

    ``static_scale`` ([1] float32, ``tensor`` only): quantize at this scale, which is returned.
    ``pdl``: the launches are programmatic dependents (``kernels.pdl``; sm90 only).
    ``maxima`` ([n] float32, ``tensor`` only): absolute maxima of parts of x that cover it (those of the tiles
    of the GEMM that wrote x), whose largest is x's; then no launch reads x for its maximum.
    ``zero`` ([R, K], ``block128`` only): a tensor the launch sets to zero beside x's quantization (the layer's
    top-k sums, so no launch of their own zeroes them).
    ``group`` (``block128`` only): the columns per scale group, a power of two (the weights' block_k).
    """
    dep = dependent.launch_kwargs(pdl)
    R, K = x.shape
    assert x.stride(1) == 1
    q = torch.empty(R, K, device=x.device, dtype=FP8)
    block_k = min(1024, triton.next_power_of_2(K))
    if static_scale is not None:
        if scheme != "tensor":
            raise ValueError(f"a static activation scale is per tensor, not {scheme!r}")
        if R:
            _quantize_rows[(R,)](x, q, None, static_scale, R, K, x.stride(0), q.stride(0), PER_TENSOR=True,
                                 BLOCK_K=block_k, BLOCK_R=1024, ROUND_FIRST=interpreting(), STATIC=True, **dep)
        return q, static_scale
    if scheme == "block128":
        groups = triton.cdiv(K, group)
        scale = torch.empty(R, groups, device=x.device, dtype=torch.float32)
        if zero is not None:
            assert zero.shape == x.shape and zero.stride(1) == 1
        if R:
            _quantize_groups[(triton.cdiv(R, GROUP_ROWS), groups)](
                x, q, scale, R, K, x.stride(0), q.stride(0), scale.stride(0),
                BLOCK_R=GROUP_ROWS, GROUP_K=group, ROUND_FIRST=interpreting(), **dep,
                zero_ptr=zero, stride_z=0 if zero is None else zero.stride(0), ZERO=zero is not None)
        return q, scale
    if zero is not None:
        raise ValueError(f"the quantization launch zeroes a tensor at block128 only, not {scheme!r}")
    per_tensor = scheme == "tensor"
    if scheme not in ("tensor", "channel"):
        raise ValueError(f"unknown fp8 scheme {scheme!r}")
    if maxima is not None and not per_tensor:
        raise ValueError(f"maxima of parts of x give a per-tensor scale, not {scheme!r}")
    scale = torch.empty(1 if per_tensor else R, device=x.device, dtype=torch.float32)
    if R:
        amax = maxima
        if amax is None:
            amax = torch.empty(R, device=x.device, dtype=torch.float32)
            _row_amax[(R,)](x, amax, K, x.stride(0), BLOCK_K=block_k, **dep)
        _quantize_rows[(R,)](x, q, amax, scale, amax.numel(), K, x.stride(0), q.stride(0), PER_TENSOR=per_tensor,
                             BLOCK_K=block_k, BLOCK_R=1024, ROUND_FIRST=interpreting(), **dep)
    return q, scale
