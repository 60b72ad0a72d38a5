"""Does the persistent warp-specialized block-scaled GEMM keep its speed when A's rows are gathered, as the MoE
GEMM1 reads them? On a GPU.

``gluon_overlap.py --persistent`` measured ``_pws_gemm`` (one program per SM, a TMA loading warp running ahead
across tiles, two 64-row consumer groups scaling one K step's product under the next one's MMA) within 1.06x
(DeepSeek-V3@tp8's GEMM1 width) and 1.21x (Qwen3's) of cuBLAS's block-scaled GEMM over contiguous rows. The MoE
GEMM1 reads a token's row of x for each slot, in the align step's order, which TMA cannot load on Hopper.
``_pgws_gemm`` is the same kernel with A gathered by a second producer partition of GATHER_WARPS warps (1 or 2,
GATHERERS): each thread copies its 16-byte pieces of the tile's rows with ``cp.async`` and arrives on the step's
``ready`` barrier (``noinc``: the barrier counts the 32 * GATHER_WARPS threads and the TMA warp's arrival). The
copies are generic-proxy writes, which the MMAs' async proxy sees after a proxy fence (``fence_async_shared``):
either each consumer group fences after each wait (``lag`` 0) or each gathering thread waits for its copies of the
step before, fences them and then arrives (``lag`` 1: the steps whose copies stay in flight behind the newest).

At the GEMM1 shapes of ``dense_gather.py`` (all 32768 slots of M=4096, uniform routing's sorted slots), each
checked against the float32 product into a NaN-filled C, then timed:

- ``cublas_block``: cuBLAS's block-scaled GEMM over the gathered rows stacked contiguous (no gather);
- ``pws4``: ``_pws_gemm`` over the same contiguous rows by TMA (no gather);
- ``pgws4``, ``pgws_sync``: ``_pgws_gemm`` over x's rows through the slots' order, overlapped or waiting for each
  MMA, at each ``lag``. A's 1x128 scales are passed by slot (the layer would read them through the order too: 64
  floats a step).

    PYTHONPATH=$PWD python3 scripts/gluon_gather.py > rows.jsonl
"""

from __future__ import annotations

import itertools
import json

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from dense_gather import SHAPES, _timed, gather_inputs  # scripts beside this one
from gluon_overlap import (_FIRST_ROWS, _SECOND_ROWS, _p_consumer, _p_loader, _ring_of, _tile_count, _tile_origin,
                           cublas_block, run_form)
from moebench.roofline import measure_ceilings

# triton 3.6 names the pointer copy into shared memory async_copy_global_to_shared; later versions async_load
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
# (warps, registers per thread) of the gathering partition: with the consumers at 232 registers (what the
# overlapped form needs, gluon_overlap's _pws_gemm) and the TMA warp at 40, 65536 leave 4864 for it
GATHERERS = ((1, 152), (2, 72))
STAGES = (4, 6)
LAGS = (0, 1)  # _a_gatherer's: 0 the consumers fence after each wait; 1 the gatherer fences its landed copies


@gluon.jit
def _a_gatherer(ring, rows_ptr, stride_a, M, N, K, STAGES: gl.constexpr, WARPS: gl.constexpr, LAG: gl.constexpr):
    """WARPS warps: A's tile of every K step, row r of the tile being row rows[off_m + r] of a, by cp.async.

    LAG = 0: each thread's arrival on the step's ``ready`` fires when its copies land (the consumers fence).
    LAG > 0: after issuing step i, each thread waits for its copies of step i - LAG, fences them for the async
    proxy and arrives for that step (the consumers do not fence), so LAG + 1 steps of copies are in flight."""
    a_ptr, b_desc, a_smem, ready, empty = ring[0], ring[1], ring[2], ring[4], ring[5]
    BM: gl.constexpr = a_smem.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [WARPS, 1], [1, 0])  # 16 bytes a thread
    slots = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, 128, layout=gl.SliceLayout(0, layout))
    i = 0
    for t in range(gl.program_id(0), _tile_count(M, N, BM, BN), gl.num_programs(0)):
        off_m, off_n = _tile_origin(t, N, BM, BN)
        src = gl.load(rows_ptr + off_m + slots, mask=off_m + slots < M, other=0)  # [BM] rows of a
        ptrs = a_ptr + src.to(gl.int64)[:, None] * stride_a + cols[None, :]
        for k in range(K // 128):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            _cp_async(a_smem.index(s), ptrs + k * 128)
            if LAG == 0:
                async_copy.mbarrier_arrive(ready.index(s), increment_count=False)
            else:
                async_copy.commit_group()
                if i >= LAG:
                    _copies_landed(ready.index((i - LAG) % STAGES), LAG)
            i += 1
    if LAG > 0:  # the last LAG steps
        for j in range(i - LAG, i):
            if j >= 0:
                _copies_landed(ready.index(j % STAGES), 0)


@gluon.jit
def _copies_landed(bar, pending: gl.constexpr):
    """This thread's copies but the last ``pending`` groups have landed: fence them for the async proxy and arrive
    on ``bar`` (a cp.async arrival, one per thread, as LAG = 0's; nothing is in flight before it)."""
    async_copy.wait_group(pending)
    fence_async_shared()
    async_copy.mbarrier_arrive(bar, increment_count=False)


@gluon.jit
def _pgws_gemm(a_ptr, rows_ptr, b_desc, as_ptr, bs_ptr, c_ptr, M, N, K, stride_a, stride_as, stride_bs,
               BM: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr, UNROLL: gl.constexpr,
               GATHER_WARPS: gl.constexpr, GATHER_REGS: gl.constexpr, LAG: gl.constexpr, num_warps: gl.constexpr):
    """C[slot, :] = a[rows[slot], :] . B^T with the block scales, persistent and warp-specialized: two 64-row
    consumer groups, a TMA warp for B and GATHER_WARPS warps gathering A."""
    # A's buffers as TMA would fill them; ``ready`` counts B's TMA arrival and each gathering thread's
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, 128], gl.float8e4nv)
    a_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, 128], a_layout)
    a_smem, b_smem, ready, empty = _ring_of(a_smem, b_desc, STAGES, 1 + GATHER_WARPS * 32)
    ring = (a_ptr, b_desc, a_smem, b_smem, ready, empty, 0, 0)
    out = (as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs)
    gl.warp_specialize([(_p_consumer, (ring, out, _FIRST_ROWS, STAGES, OVERLAP, UNROLL, LAG == 0)),
                        (_p_consumer, (ring, out, _SECOND_ROWS, STAGES, OVERLAP, UNROLL, LAG == 0)),
                        (_p_loader, (ring, M, N, K, STAGES, False)),
                        (_a_gatherer, (ring, rows_ptr, stride_a, M, N, K, STAGES, GATHER_WARPS, LAG))],
                       [4, 1, GATHER_WARPS], [232, 40, GATHER_REGS])


def run_gathered(x8, tok, b, a_s, b_s, c, stages: int, overlap: bool, lag: int, gatherer: tuple[int, int]):
    """A launch of ``_pgws_gemm``: C [slots, N] from x8's rows through tok, 128x128 tiles."""
    slots, N, K = tok.shape[0], b.shape[0], b.shape[1]
    unroll = 4 if overlap else 2
    assert K % (128 * unroll) == 0 and N % 128 == 0, "K in whole loop iterations, N in whole tiles"
    b_desc = TensorDescriptor.from_tensor(b, [128, 128], gl.NVMMASharedLayout.get_default_for([128, 128],
                                                                                           gl.float8e4nv))
    sms = torch.cuda.get_device_properties(x8.device).multi_processor_count
    grid = (min(triton.cdiv(slots, 128) * (N // 128), sms),)  # a program per SM, or per tile where fewer
    return lambda: _pgws_gemm[grid](x8, tok, b_desc, a_s, b_s, c, slots, N, K, x8.stride(0), a_s.stride(0),
                                    b_s.stride(0), BM=128, STAGES=stages, OVERLAP=overlap, UNROLL=unroll,
                                    GATHER_WARPS=gatherer[0], GATHER_REGS=gatherer[1], LAG=lag, num_warps=4)


def main() -> None:
    ceilings = measure_ceilings()
    print(json.dumps(dict(ceilings=ceilings.as_dict())), flush=True)
    fp8_rate = ceilings.fp8_tflops * 1e12
    g = torch.Generator(device="cuda").manual_seed(0)
    for label, slots, N, K, topk in SHAPES:
        if not topk:  # GEMM1 only: GEMM2's K of 768 and 256 is not whole loop iterations of 4 steps
            continue
        x8, _, tok, gathered, a_s, b, b_s, ref = gather_inputs(slots, N, K, topk, g)
        c = torch.empty(slots, N, device="cuda", dtype=torch.bfloat16)
        flops = 2 * slots * N * K
        block = cublas_block(gathered, b, a_s, b_s, ref)
        if block is not None:
            _timed(label, "cublas_block", block, c, ref, flops, fp8_rate, returns=True)
        for stages in STAGES:
            _timed(label, "pws4", run_form(gathered, b, a_s, b_s, c, "gluon_pws4", 128, 128, 4, stages), c, ref,
                   flops, fp8_rate, stages=stages)
            for (overlap, name), lag, gatherer in itertools.product(((True, "pgws4"), (False, "pgws_sync")), LAGS,
                                                                    GATHERERS):
                tag = dict(stages=stages, lag=lag, gather_warps=gatherer[0])
                try:
                    fn = run_gathered(x8, tok, b, a_s, b_s, c, stages, overlap, lag, gatherer)
                    _timed(label, name, fn, c, ref, flops, fp8_rate, **tag)
                except Exception as e:  # a variant that does not compile: say why, go on
                    print(json.dumps(dict(shape=label, a=name, **tag,
                                          error=f"{type(e).__name__}: {str(e)[:400]}")), flush=True)


if __name__ == "__main__":
    main()
