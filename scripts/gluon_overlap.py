"""A block-scaled fp8 GEMM that scales one K step's product while the next step's MMA runs, unserialized.

Session 10's Gluon prototype of that overlap (``scripts/gluon_block128.py``, ``gluon_async``) ran no faster
than waiting for every MMA, and its conclusion was that the waits do not hold fp8-block128 back. But ptxas
serialized that kernel's MMAs: compiled for sm90a it reports "(C7514) Potential Performance Loss:
wgmma.mma_async instructions are serialized due to non wgmma instructions reading accumulator registers of a
wgmma between start and end of the pipeline stage". Its loop carries step k's product, MMA in flight, across
the back edge in registers other than those the MMA wrote, so a copy reads them before their wait. A first
version of the kernel below, which carried each product in the registers its MMA writes (no copy in the
PTX) but still left one MMA in flight across the back edge, was reported serialized as well.

This kernel keeps each MMA's flight inside one iteration. It holds two product tiles, X for even K steps and
Y for odd ones; each MMA writes into the tile it uses (``use_acc=False``: the old value, already scaled and
added, is ignored). An iteration runs UNROLL steps: step k's MMA is issued, then step k-1's product waited
for (one MMA in flight) and scaled into the accumulator; the last step's product is waited for and scaled
with no MMA under it. So UNROLL - 1 of every UNROLL scalings run under an MMA. ``OVERLAP=False`` waits for
each MMA before scaling its product (the order of Triton's code). ``_pair_gemm``'s warps also load the
buffers (all STAGES first, then a buffer once every warp is past the MMA that read it); ``_ws_gemm`` is
warp-specialized as CUTLASS's Hopper GEMMs are: one warp loads by TMA, two 4-warp groups take 64 rows each of
a 128-row tile and release a buffer by an mbarrier, so each group can scale while the other's MMA runs.

It times, at session 10's shapes (dense, M = 16384, Qwen3's and DeepSeek-V3@tp8's GEMM1 widths; the fp8 rate
measured in the same run), each variant checked against the float32 reference first (output poisoned):

- ``gluon_pair2`` / ``gluon_pair4``: ``_pair_gemm`` overlapped, 2 / 4 steps per iteration;
  ``gluon_pair_sync``: ``_pair_gemm`` waiting for each MMA;
- ``gluon_ws2`` / ``gluon_ws4`` / ``gluon_ws_sync``: the same three forms of ``_ws_gemm``;
- ``gluon_async`` / ``gluon_sync``: session 10's kernels (``gluon_async`` the serialized one);
- ``triton`` / ``triton_plain``: session 10's Triton kernel with the block scales / the same fp8 product
  without them;
- ``cublas_block``: ``torch._scaled_mm`` with 1x128 activation and 128x128 weight scales (cuBLAS's
  block-scaled GEMM), where this torch has it for sm90; ``cublas_plain`` without scales. Each is checked
  and timed with a copy of its output into the poisoned C (as session 10's ``cublas_plain``), then timed
  without the copy (``*_bare``).

    PYTHONPATH=$PWD python3 scripts/gluon_overlap.py > out.txt   # JSON rows, then a table

``--compile-only`` (no GPU needed): compiles the Gluon kernels for sm90a and prints, per variant, the
``wgmma.wait_group`` counts of the PTX, ptxas's register count and whether it reports C7514.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# triton 3.6 names the TMA tile load async_copy_global_to_shared; later versions async_load (and the old name raises)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# and the CTA-wide barrier thread_barrier; later versions barrier
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gluon_block128 as s10  # noqa: E402 - session 10's kernels, the baselines

# (BLOCK_M, BLOCK_N, num_warps, STAGES): session 10's three tiles (64x64 w4 ran slowest there: left out) and
# the 64x128 tile at 3 stages
TILES = [(64, 128, 4, 4), (128, 128, 8, 4), (64, 128, 4, 3)]
# (OVERLAP, UNROLL) by row name: of ``_pair_gemm`` (gluon_pair*, at TILES) and ``_ws_gemm`` (gluon_ws*, 128x128
# tiles at WS_STAGES)
FORMS = {"gluon_pair_sync": (False, 2), "gluon_pair2": (True, 2), "gluon_pair4": (True, 4),
         "gluon_ws_sync": (False, 2), "gluon_ws2": (True, 2), "gluon_ws4": (True, 4),
         "gluon_pws_sync": (False, 2), "gluon_pws4": (True, 4)}
PAIR_FORMS = [f for f in FORMS if f.startswith("gluon_pair")]
WS_FORMS = [f for f in FORMS if f.startswith("gluon_ws")]
PWS_FORMS = [f for f in FORMS if f.startswith("gluon_pws")]  # _pws_gemm, the persistent _ws_gemm (--persistent)
WS_STAGES = (4, 6)
# what is compiled and timed: each tile (BLOCK_M, BLOCK_N, num_warps, STAGES) with its forms; the
# warp-specialized tiles are 128x128 at num_warps 4 (the first consumer group; the kernel adds the other warps)
RUNS = [(tile, PAIR_FORMS) for tile in TILES] + [((128, 128, 4, stages), WS_FORMS) for stages in WS_STAGES]
# --persistent: the warp-specialized kernel as it is and made persistent, at the same tiles
PERSISTENT_RUNS = [((128, 128, 4, stages), ["gluon_ws_sync", "gluon_ws4", *PWS_FORMS]) for stages in WS_STAGES]
SHAPES = [(16384, 1536, 2048), (16384, 512, 7168)]  # Qwen3 and DeepSeek-V3@tp8 GEMM1 widths, as session 10


@gluon.jit
def _load_step(a_desc, b_desc, a_smem, b_smem, ready, off_m, off_n, step, k_steps, STAGES: gl.constexpr):
    """Start the TMA loads of K step ``step`` into its buffer (none past the last step)."""
    s = step % STAGES
    ok = step < k_steps
    BK: gl.constexpr = a_desc.block_type.shape[1]
    mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=ok)
    _tma_load(a_desc, [off_m, step * BK], ready.index(s), a_smem.index(s), pred=ok)
    _tma_load(b_desc, [off_n, step * BK], ready.index(s), b_smem.index(s), pred=ok)


@gluon.jit
def _step_done(ring, step, k_steps, STAGES: gl.constexpr, WS: gl.constexpr):
    """Step ``step``'s MMA is complete in this warp group. With WS, say so to the loading warp (``empty``);
    else, once every warp is past it, load step + STAGES into its buffer here."""
    a_desc, b_desc, a_smem, b_smem, ready, empty, off_m, off_n = ring
    if WS:
        mbarrier.arrive(empty.index(step % STAGES))
    else:
        _cta_barrier()
        _load_step(a_desc, b_desc, a_smem, b_smem, ready, off_m, off_n, step + STAGES, k_steps, STAGES)


@gluon.jit
def _mma_step(ring, step, into, ROW0: gl.constexpr, STAGES: gl.constexpr, FENCE: gl.constexpr = False):
    """Issue step ``step``'s MMA over rows ROW0.. of its A tile once its buffer is loaded, writing the
    registers of ``into`` (its old value ignored); returns the product, in flight. FENCE: the buffer was
    written by generic-proxy copies (cp.async), which the MMA's async proxy sees after a proxy fence."""
    a_smem, b_smem, ready = ring[2], ring[3], ring[4]
    s = step % STAGES
    mbarrier.wait(ready.index(s), (step // STAGES) & 1)
    if FENCE:
        fence_async_shared()
    a = a_smem.index(s).slice(ROW0, into.shape[0])
    return warpgroup_mma(a, b_smem.index(s).permute((1, 0)), into, use_acc=False, is_async=True)


@gluon.jit
def _scale(scale_ptrs, b_scale_ptr, row_ok, step):
    """[rows] the scale of step ``step``'s product rows: their 1x128 group's times the tile's 128x128 block's."""
    return gl.load(scale_ptrs + step, mask=row_ok, other=0.0) * gl.load(b_scale_ptr + step)


@gluon.jit
def _in_order(t):
    """``t`` unchanged, through an asm statement the compiler keeps in program order among the MMAs: the
    product scaled into ``t`` is read before the next MMA is issued into its registers (LLVM would otherwise
    schedule that read after the MMA, and keep the product in other registers)."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [t], dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _tile(ring, as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs, off_m, off_n, base, ROW0: gl.constexpr,
          ROWS: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr, UNROLL: gl.constexpr, WS: gl.constexpr,
          FENCE: gl.constexpr = False):
    """C rows off_m + ROW0 .. + ROWS of the tile at (off_m, off_n): sum over 128-wide K steps k of (A_k . B_k^T) *
    as[row, k] * bs[n // 128, k], by the warps that run it (one warp group per 64 rows), from the buffers of
    ``ring``, whose step ``base + k`` holds K step k (base > 0: a persistent program's later tiles)."""
    b_desc = ring[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]  # B is [N, K]; its tiles [BN, 128]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[ROWS // 16, 1],
                                                  instr_shape=[16, BN, 32])
    k_steps = K // 128
    rows = off_m + ROW0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma))  # [ROWS]
    row_ok = rows < M
    a_scales = as_ptr + rows * stride_as  # [ROWS] these rows of as [M, K / 128]
    b_scales = bs_ptr + (off_n // 128) * stride_bs  # the tile's row of bs [N / 128, K / 128]
    acc = gl.zeros([ROWS, BN], gl.float32, layout=mma)
    x = gl.zeros([ROWS, BN], gl.float32, layout=mma)  # even steps' products
    y = gl.zeros([ROWS, BN], gl.float32, layout=mma)  # odd steps' products
    for k0 in range(0, k_steps, UNROLL):
        if OVERLAP:
            # each MMA is issued before the previous one's product is waited for and scaled; no MMA is left
            # in flight across the loop's back edge, where ptxas would serialize them all (C7514)
            x_scale = _scale(a_scales, b_scales, row_ok, k0)
            x = _mma_step(ring, base + k0, x, ROW0, STAGES, FENCE)
            for j in gl.static_range(1, UNROLL):
                if j % 2 == 1:
                    y_scale = _scale(a_scales, b_scales, row_ok, k0 + j)
                    y = _mma_step(ring, base + k0 + j, y, ROW0, STAGES, FENCE)
                    y, x = warpgroup_mma_wait(num_outstanding=1, deps=(y, x))
                    acc = _in_order(acc + x * x_scale[:, None])
                else:
                    x_scale = _scale(a_scales, b_scales, row_ok, k0 + j)
                    x = _mma_step(ring, base + k0 + j, x, ROW0, STAGES, FENCE)
                    x, y = warpgroup_mma_wait(num_outstanding=1, deps=(x, y))
                    acc = _in_order(acc + y * y_scale[:, None])
                _step_done(ring, base + k0 + j - 1, k_steps, STAGES, WS)
            y = warpgroup_mma_wait(num_outstanding=0, deps=(y, ))
            acc += y * y_scale[:, None]
            _step_done(ring, base + k0 + UNROLL - 1, k_steps, STAGES, WS)
        else:
            for j in gl.static_range(UNROLL):
                x = _mma_step(ring, base + k0 + j, x, ROW0, STAGES, FENCE)
                x = warpgroup_mma_wait(num_outstanding=0, deps=(x, ))
                _step_done(ring, base + k0 + j, k_steps, STAGES, WS)
                acc += x * _scale(a_scales, b_scales, row_ok, k0 + j)[:, None]
    cols = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))  # [BN]
    gl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None])


@gluon.jit
def _ring(a_desc, b_desc, STAGES: gl.constexpr):
    """The tile's STAGES buffers of A and B and their barriers: ``ready`` (loaded) and ``empty`` (read by both
    consumer warp groups, where warp-specialized)."""
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES, a_desc.block_type.shape[0], 128], a_desc.layout)
    return _ring_of(a_smem, b_desc, STAGES, 1)


@gluon.jit
def _ring_of(a_smem, b_desc, STAGES: gl.constexpr, READY_COUNT: gl.constexpr):
    """``_ring`` around A's buffers ``a_smem`` [STAGES, BM, 128], with READY_COUNT arrivals per fill (a layout cannot
    be passed between triton 3.6's Gluon functions, so the caller allocates A's buffers)."""
    BM: gl.constexpr = a_smem.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    b_smem = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, 128], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=READY_COUNT)
        mbarrier.init(empty.index(i), count=BM // 64)
    return a_smem, b_smem, ready, empty


@gluon.jit
def _pair_gemm(a_desc, b_desc, as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs,
               STAGES: gl.constexpr, OVERLAP: gl.constexpr, UNROLL: gl.constexpr, num_warps: gl.constexpr):
    """C[BM, BN] tile by all the program's warps, which also load its buffers (BM = 16 * num_warps).

    K must be a whole multiple of UNROLL 128-wide steps (UNROLL even: the loop body alternates X and Y)."""
    off_m = gl.program_id(0) * a_desc.block_type.shape[0]
    off_n = gl.program_id(1) * b_desc.block_type.shape[0]
    a_smem, b_smem, ready, empty = _ring(a_desc, b_desc, STAGES)
    for i in gl.static_range(STAGES):
        _load_step(a_desc, b_desc, a_smem, b_smem, ready, off_m, off_n, i, K // 128, STAGES)
    ring = (a_desc, b_desc, a_smem, b_smem, ready, empty, off_m, off_n)
    _tile(ring, as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs, off_m, off_n, 0, 0, a_desc.block_type.shape[0],
          STAGES, OVERLAP, UNROLL, False)


@gluon.jit
def _loader(ring, K, STAGES: gl.constexpr):
    """The loading warp: step k's tiles into buffer k % STAGES once both consumers are done with step
    k - STAGES (a fresh barrier's wait for parity 1 passes at once)."""
    a_desc, b_desc, a_smem, b_smem, ready, empty, off_m, off_n = ring
    for k in range(K // 128):
        mbarrier.wait(empty.index(k % STAGES), ((k // STAGES) & 1) ^ 1)
        _load_step(a_desc, b_desc, a_smem, b_smem, ready, off_m, off_n, k, K // 128, STAGES)


@gluon.jit
def _consumer(ring, out, ROW0: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr, UNROLL: gl.constexpr):
    """One 4-warp group's 64 rows of the tile; ``out`` holds _tile's scale and output arguments."""
    as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs = out
    _tile(ring, as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs, ring[6], ring[7], 0, ROW0, 64, STAGES, OVERLAP,
          UNROLL, True)


_FIRST_ROWS = gl.constexpr(0)  # where each consumer group's 64 rows start in the 128-row tile
_SECOND_ROWS = gl.constexpr(64)


@gluon.jit
def _ws_gemm(a_desc, b_desc, as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs,
             STAGES: gl.constexpr, OVERLAP: gl.constexpr, UNROLL: gl.constexpr, num_warps: gl.constexpr):
    """C[128, BN] tile, warp-specialized: a loading warp (TMA) and two 4-warp consumer groups of 64 rows each
    that run apart, each scaling its products while the other's MMA runs (num_warps = 4: the first group)."""
    off_m = gl.program_id(0) * a_desc.block_type.shape[0]
    off_n = gl.program_id(1) * b_desc.block_type.shape[0]
    a_smem, b_smem, ready, empty = _ring(a_desc, b_desc, STAGES)
    ring = (a_desc, b_desc, a_smem, b_smem, ready, empty, off_m, off_n)
    out = (as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs)
    gl.warp_specialize([(_consumer, (ring, out, _FIRST_ROWS, STAGES, OVERLAP, UNROLL)),
                        (_consumer, (ring, out, _SECOND_ROWS, STAGES, OVERLAP, UNROLL)),
                        (_loader, (ring, K, STAGES))], [4, 1], [232, 40])


@gluon.jit
def _tile_origin(t, N, BM: gl.constexpr, BN: gl.constexpr):
    """(off_m, off_n) of tile t, the column tiles of a row of tiles one after another."""
    n_tiles = N // BN
    return (t // n_tiles) * BM, (t % n_tiles) * BN


@gluon.jit
def _tile_count(M, N, BM: gl.constexpr, BN: gl.constexpr):
    """Tiles of C [M, N]: a persistent program runs tiles program_id, + num_programs, ... below it."""
    return ((M + BM - 1) // BM) * (N // BN)


@gluon.jit
def _p_loader(ring, M, N, K, STAGES: gl.constexpr, LOAD_A: gl.constexpr = True):
    """The persistent loading warp: every K step of the program's tiles into the ring in turn, ring step i into
    buffer i % STAGES once both consumers are done with ring step i - STAGES, so a tile's first steps load while
    the consumers still run the last tile's MMAs and store its output. Without LOAD_A only B's tiles (A's come
    from elsewhere: ``gluon_gather.py``)."""
    a_desc, b_desc, a_smem, b_smem, ready, empty = ring[0], ring[1], ring[2], ring[3], ring[4], ring[5]
    BM: gl.constexpr = a_smem.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    i = 0
    for t in range(gl.program_id(0), _tile_count(M, N, BM, BN), gl.num_programs(0)):
        off_m, off_n = _tile_origin(t, N, BM, BN)
        for k in range(K // 128):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            if LOAD_A:
                mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
                _tma_load(a_desc, [off_m, k * 128], ready.index(s), a_smem.index(s))
            else:
                mbarrier.expect(ready.index(s), b_desc.block_type.nbytes)
            _tma_load(b_desc, [off_n, k * 128], ready.index(s), b_smem.index(s))
            i += 1


@gluon.jit
def _p_consumer(ring, out, ROW0: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr, UNROLL: gl.constexpr,
                FENCE: gl.constexpr = False):
    """One 4-warp group's 64 rows of each of the persistent program's tiles, in the loader's order (FENCE as
    ``_mma_step``'s)."""
    as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs = out
    BM: gl.constexpr = ring[2].shape[1]
    BN: gl.constexpr = ring[1].block_type.shape[0]
    k_steps = K // 128
    base = 0
    for t in range(gl.program_id(0), _tile_count(M, N, BM, BN), gl.num_programs(0)):
        off_m, off_n = _tile_origin(t, N, BM, BN)
        _tile(ring, as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs, off_m, off_n, base, ROW0, 64, STAGES,
              OVERLAP, UNROLL, True, FENCE)
        base += k_steps


@gluon.jit
def _pws_gemm(a_desc, b_desc, as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs,
              STAGES: gl.constexpr, OVERLAP: gl.constexpr, UNROLL: gl.constexpr, num_warps: gl.constexpr):
    """``_ws_gemm`` made persistent (a grid of one program per SM, each over every programs-th 128 x BN tile):
    the loading warp runs ahead across tiles, so no tile waits for its first loads after the one before it."""
    a_smem, b_smem, ready, empty = _ring(a_desc, b_desc, STAGES)
    ring = (a_desc, b_desc, a_smem, b_smem, ready, empty, 0, 0)
    out = (as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs)
    gl.warp_specialize([(_p_consumer, (ring, out, _FIRST_ROWS, STAGES, OVERLAP, UNROLL)),
                        (_p_consumer, (ring, out, _SECOND_ROWS, STAGES, OVERLAP, UNROLL)),
                        (_p_loader, (ring, M, N, K, STAGES))], [4, 1], [232, 40])


def _descs(a: torch.Tensor, b: torch.Tensor, block_m: int, block_n: int):
    """TMA descriptors of A [M, K] in [block_m, 128] tiles and B [N, K] in [block_n, 128] tiles (fp8)."""
    def desc(t, rows):
        return TensorDescriptor.from_tensor(t, [rows, 128], gl.NVMMASharedLayout.get_default_for([rows, 128],
                                                                                                 gl.float8e4nv))
    return desc(a, block_m), desc(b, block_n)


def _kernel_of(form: str):
    """The Gluon kernel that runs row name ``form``: ``_pws_gemm``, ``_ws_gemm`` or ``_pair_gemm``."""
    return _pws_gemm if form in PWS_FORMS else _ws_gemm if form in WS_FORMS else _pair_gemm


def run_form(a, b, a_s, b_s, c, form, block_m, block_n, warps, stages):
    """A launch of the Gluon kernel of row name ``form`` (``_ws_gemm`` for gluon_ws*, ``_pws_gemm`` for
    gluon_pws*, with 128-row tiles and num_warps 4): a [M, K], b [N, K] fp8; a_s [M, K/128], b_s [N/128, K/128];
    c [M, N] bf16."""
    M, K = a.shape
    N = b.shape[0]
    overlap, unroll = FORMS[form]
    assert K % (128 * unroll) == 0 and N % block_n == 0, "K in whole loop iterations, N in whole tiles"
    kernel = _kernel_of(form)
    a_desc, b_desc = _descs(a, b, block_m, block_n)
    grid = (triton.cdiv(M, block_m), N // block_n)
    if form in PWS_FORMS:  # a program per SM, or per tile where there are fewer
        grid = (min(grid[0] * grid[1], torch.cuda.get_device_properties(a.device).multi_processor_count),)
    return lambda: kernel[grid](a_desc, b_desc, a_s, b_s, c, M, N, K, a_s.stride(0), b_s.stride(0),
                                STAGES=stages, OVERLAP=overlap, UNROLL=unroll, num_warps=warps)


def cublas_block(a, b, a_s, b_s, ref=None):
    """torch._scaled_mm with 1x128 scales on a and 128x128 on b (cuBLAS), or None where unsupported.

    The scale layouts this torch wants are tried in turn: a's [M, K/128] outer-dim-major or as given, b's
    [N/128, K/128] transposed (strided or contiguous) or as given; the first this torch takes, or, given the
    float32 product ``ref``, the first whose product is within 1% of it."""
    layouts = [(sa, sb) for sa in (a_s.t().contiguous().t(), a_s) for sb in (b_s.t(), b_s.t().contiguous(), b_s)]
    for sa, sb in layouts:
        def fn(sa=sa, sb=sb):
            return torch._scaled_mm(a, b.T, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

        try:
            c = fn()
        except (RuntimeError, ValueError):
            continue
        if ref is None or ((c.float() - ref).norm() / ref.norm()).item() < 0.01:
            return fn
    return None


def _tile_label(tile, forms) -> str:
    block_m, block_n, warps, stages = tile
    return f"{block_m}x{block_n}x128 {'ws' if forms != PAIR_FORMS else f'w{warps}'} s{stages}"


def compile_only(runs) -> None:
    """Compile the Gluon kernels for sm90a; print each one's waits and whether ptxas serialized its MMAs."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    ptxas = get_ptxas(90).path  # the ptxas triton compiles sm90 with
    for (block_m, block_n, warps, stages), forms in runs:
        a = torch.empty(block_m, 256, dtype=torch.float8_e4m3fn)
        b = torch.empty(block_n, 256, dtype=torch.float8_e4m3fn)
        a_desc, b_desc = _descs(a, b, block_m, block_n)
        sig = dict(a_desc=mangle_type(a_desc), b_desc=mangle_type(b_desc), as_ptr="*fp32", bs_ptr="*fp32",
                   c_ptr="*bf16", M="i32", N="i32", K="i32", stride_as="i32", stride_bs="i32",
                   STAGES="constexpr", num_warps="constexpr")
        kernels = [(name, _kernel_of(name), dict(OVERLAP=FORMS[name][0], UNROLL=FORMS[name][1])) for name in forms]
        if forms == PAIR_FORMS:
            kernels += [(name, s10._gluon_block128, dict(OVERLAP=overlap))
                        for name, overlap in (("gluon_sync", False), ("gluon_async", True))]
        for name, fn, order in kernels:
            constexprs = dict(STAGES=stages, num_warps=warps, **order)
            src = GluonASTSource(fn, {**sig, **{key: "constexpr" for key in order}}, constexprs=constexprs)
            tag = dict(kernel=name, tile=_tile_label((block_m, block_n, warps, stages), forms))
            try:
                ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps)).asm["ptx"]
            except Exception as e:  # noqa: BLE001 - session 10's kernels use triton 3.6's names
                print(json.dumps({**tag, "error": str(e).strip().splitlines()[-1][:160]}))
                continue
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "k.ptx")
                with open(path, "w") as f:
                    f.write(ptx)
                log = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", path + ".cubin"],
                                     capture_output=True, text=True).stderr
            regs = re.search(r"Used (\d+) registers", log)
            waits = {w: ptx.count(f"wgmma.wait_group.sync.aligned {w};") for w in (0, 1)}
            print(json.dumps(dict(**tag, wait_group=waits, serialized="C7514" in log,
                                  registers=int(regs.group(1)) if regs else None)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile-only", action="store_true", help="compile for sm90a and ask ptxas; no GPU needed")
    p.add_argument("--persistent", action="store_true",
                   help="only cuBLAS and the warp-specialized kernel as it is and persistent (PERSISTENT_RUNS)")
    args = p.parse_args()
    runs = PERSISTENT_RUNS if args.persistent else RUNS
    if args.compile_only:
        compile_only(runs)
        return
    from moebench.roofline import measure_ceilings
    from moebench.timing import time_graph

    ceilings = measure_ceilings()
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows = []
    for M, N, K in SHAPES:
        a, b, a_s, b_s, ref, plain = s10.block128_inputs(M, N, K, gen)
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        row = dict(M=M, N=N, K=K, tile="cublas", fp8_tflops=round(ceilings.fp8_tflops))
        cublas = {"cublas_block": cublas_block(a, b, a_s, b_s), "cublas_plain": s10.cublas_plain(a, b)}
        for name, fn in cublas.items():  # checked with the copy into c, then timed without it as well
            if fn is None:
                row[f"{name}_error"] = "this torch has no 1x128/128x128 block-scaled _scaled_mm"
                continue
            s10._check_then_time(row, {name: lambda fn=fn, c=c: c.copy_(fn())}, c,
                                 ref if "block" in name else plain, M * N * K, ceilings)
            if name in row:  # it passed its check
                t = time_graph(fn, budget_s=0.3).median_us
                row[f"{name}_bare"] = round(t, 1)
                row[f"{name}_bare_pct_fp8"] = round(2 * M * N * K / (t * 1e-6) / 1e12 / ceilings.fp8_tflops * 100, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
        for tile, forms in runs:
            ws = forms != PAIR_FORMS
            row = dict(M=M, N=N, K=K, tile=_tile_label(tile, forms), fp8_tflops=round(ceilings.fp8_tflops))
            variants = {form: run_form(a, b, a_s, b_s, c, form, *tile) for form in forms}
            if not ws:
                variants.update({"gluon_async": s10.run_gluon(a, b, a_s, b_s, c, *tile, True),
                                 "gluon_sync": s10.run_gluon(a, b, a_s, b_s, c, *tile, False),
                                 "triton": s10.run_triton(a, b, a_s, b_s, c, *tile)})
            s10._check_then_time(row, variants, c, ref, M * N * K, ceilings)
            if not ws:
                s10._check_then_time(row, {"triton_plain": s10.run_triton(a, b, a_s, b_s, c, *tile, scaled=False)},
                                     c, plain, M * N * K, ceilings)
            print(json.dumps(row), flush=True)
            rows.append(row)
    _table(rows)


def _table(rows: list[dict]) -> None:
    """us (% of the fp8 rate) per shape, tile and variant; '-' where a variant has no time."""
    names = [*FORMS, "gluon_sync", "gluon_async", "triton", "triton_plain", "cublas_block", "cublas_block_bare",
             "cublas_plain", "cublas_plain_bare"]
    print("N x K, tile | " + " | ".join(names))
    for row in rows:
        cells = [f"{row[n]} ({row[n + '_pct_fp8']}%)" if n in row else "-" for n in names]
        print(f"{row['N']} x {row['K']}, {row['tile']} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
