"""On an H200: does a block-scaled fp8 GEMM gain from scaling step k-1's product while step k's MMA runs?

Triton compiles moebench's fp8-block128 K loop so that it waits for every MMA before scaling its product
(`wgmma.wait_group 0`, results/h200-session10/wgmma-waits.jsonl). Gluon (triton.experimental.gluon)
issues the MMAs itself. Three kernels of the same dense product, C[M, N] = sum over 128-wide K steps k
of (A_k @ B_k^T) * a_scale[:, k] * b_scale[n // 128, k] (A [M, K] and B [N, K] fp8 e4m3, C bf16):

- `triton`: the form of moebench's kernels (pointer loads, `acc += tl.dot(a, b) * scale`);
- `gluon_sync`: Gluon, TMA loads into a ring of STAGES buffers, each MMA waited for, then scaled;
- `gluon_async`: the same, but step k's MMA is issued before step k-1's product is waited for and
  scaled (`warpgroup_mma_wait(num_outstanding=1)`), so the scaling runs under the next MMA;

and, for what the block scales cost, the same fp8 product without scales: `triton_plain` (the first
kernel, `acc = tl.dot(a, b, acc)`, its MMAs left in flight) and `cublas_plain` (`torch._scaled_mm`
and a copy of its output).

Each checked against the float32 reference first, then timed (CUDA-graph replay, L2 flushed, median
us), with the fp8 matmul ceiling measured in the same run. Dense, not the MoE layer: the A rows of the
layer are gathered per expert, which TMA cannot do on Hopper.

    PYTHONPATH=$PWD python3 scripts/gluon_block128.py > rows.jsonl
"""

import json

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from moebench.roofline import measure_ceilings
from moebench.timing import time_graph


@triton.jit
def _triton_block128(a_ptr, b_ptr, as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SCALED: tl.constexpr):
    BLOCK_K: tl.constexpr = 128
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * K + offs_k[None, :]
    b_ptrs = b_ptr + offs_k[:, None] + cols[None, :].to(tl.int64) * K  # [BK, BN] view of B [N, K]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        b = tl.load(b_ptrs)
        if SCALED:
            scale = tl.load(as_ptr + rows * stride_as + k, mask=row_ok, other=0.0) * tl.load(
                bs_ptr + (tl.program_id(1) * BLOCK_N // 128) * stride_bs + k)
            acc += tl.dot(a, b) * scale[:, None]
        else:  # the plain fp8 product, no scales: the MMA accumulates and runs ahead
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None])


@gluon.jit
def _gluon_block128(a_desc, b_desc, as_ptr, bs_ptr, c_ptr, M, N, K, stride_as, stride_bs,
                    STAGES: gl.constexpr, OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]  # 128: one scale block per step
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]  # B is [N, K], its tiles [BLOCK_N, BLOCK_K]
    off_m = gl.program_id(0) * BLOCK_M
    off_n = gl.program_id(1) * BLOCK_N
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_smem = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    k_steps = gl.cdiv(K, BLOCK_K)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    for i in gl.static_range(STAGES - 1):  # fill all but one buffer
        ok = i < k_steps
        mbarrier.expect(ready.index(i), nbytes, pred=ok)
        tma.async_copy_global_to_shared(a_desc, [off_m, i * BLOCK_K], ready.index(i), a_smem.index(i), pred=ok)
        tma.async_copy_global_to_shared(b_desc, [off_n, i * BLOCK_K], ready.index(i), b_smem.index(i), pred=ok)

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_N, 32])
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
    row_ok = rows < M
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma)
    acc = zero
    prev = warpgroup_mma_init(zero)  # step k-1's product (OVERLAP), in flight
    prev_scale = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, mma))
    for k in range(k_steps):
        s = k % STAGES
        mbarrier.wait(ready.index(s), (k // STAGES) & 1)
        d = warpgroup_mma(a_smem.index(s), b_smem.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
        scale = gl.load(as_ptr + rows * stride_as + k, mask=row_ok, other=0.0) * gl.load(
            bs_ptr + (off_n // 128) * stride_bs + k)
        if OVERLAP:
            # Step k-1's MMA done, step k's still running: scale k-1's product now.
            p = warpgroup_mma_wait(num_outstanding=1, deps=(prev,))
            acc += p * prev_scale[:, None]
            prev = d
            prev_scale = scale
        else:
            p = warpgroup_mma_wait(num_outstanding=0, deps=(d,))
            acc += p * scale[:, None]
        # The buffer step k-1 read is free: load step k + STAGES - 1 into it.
        kn = k + STAGES - 1
        sn = kn % STAGES
        pred = kn < k_steps
        mbarrier.expect(ready.index(sn), nbytes, pred=pred)
        tma.async_copy_global_to_shared(a_desc, [off_m, kn * BLOCK_K], ready.index(sn), a_smem.index(sn), pred=pred)
        tma.async_copy_global_to_shared(b_desc, [off_n, kn * BLOCK_K], ready.index(sn), b_smem.index(sn), pred=pred)
    if OVERLAP:
        p = warpgroup_mma_wait(num_outstanding=0, deps=(prev,))
        acc += p * prev_scale[:, None]
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    gl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None])


def run_triton(a, b, a_s, b_s, c, block_m, block_n, warps, stages, scaled=True):
    M, K = a.shape
    N = b.shape[0]
    grid = (triton.cdiv(M, block_m), N // block_n)
    return lambda: _triton_block128[grid](a, b, a_s, b_s, c, M, N, K, a_s.stride(0), b_s.stride(0),
                                          BLOCK_M=block_m, BLOCK_N=block_n, SCALED=scaled, num_warps=warps,
                                          num_stages=stages)


def run_gluon(a, b, a_s, b_s, c, block_m, block_n, warps, stages, overlap):
    M, K = a.shape
    N = b.shape[0]
    a_desc = TensorDescriptor.from_tensor(a, [block_m, 128], gl.NVMMASharedLayout.get_default_for(
        [block_m, 128], gl.float8e4nv))
    b_desc = TensorDescriptor.from_tensor(b, [block_n, 128], gl.NVMMASharedLayout.get_default_for(
        [block_n, 128], gl.float8e4nv))
    grid = (triton.cdiv(M, block_m), N // block_n)
    return lambda: _gluon_block128[grid](a_desc, b_desc, a_s, b_s, c, M, N, K, a_s.stride(0), b_s.stride(0),
                                         STAGES=stages, OVERLAP=overlap, num_warps=warps)


def cublas_plain(a, b):
    """torch._scaled_mm with unit row and column scales (cuBLAS): the same fp8 product without block scales."""
    ones_m, ones_n = torch.ones(a.shape[0], 1, device="cuda"), torch.ones(1, b.shape[0], device="cuda")
    return lambda: torch._scaled_mm(a, b.T, ones_m, ones_n, out_dtype=torch.bfloat16)


def run_cublas(a, b, c):
    """``cublas_plain``, its result copied into c."""
    fn = cublas_plain(a, b)
    return lambda: c.copy_(fn())


def block128_inputs(M: int, N: int, K: int, gen: torch.Generator):
    """Random fp8 a [M, K] and b [N, K], scales a_s [M, K/128] and b_s [N/128, K/128] in [0.5, 1.5), and the
    float32 products: ref with the scales, plain without them."""
    a = torch.randn(M, K, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    b = torch.randn(N, K, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    a_s = torch.rand(M, K // 128, device="cuda", generator=gen) + 0.5
    b_s = torch.rand(N // 128, K // 128, device="cuda", generator=gen) + 0.5
    ref = (a.float() * a_s.repeat_interleave(128, 1)) @ (b.float() * b_s.repeat_interleave(128, 0)
                                                          .repeat_interleave(128, 1)).T
    return a, b, a_s, b_s, ref, a.float() @ b.float().T


def main() -> None:
    ceilings = measure_ceilings()
    gen = torch.Generator(device="cuda").manual_seed(7)
    for M, N, K in ((16384, 1536, 2048), (16384, 512, 7168)):  # Qwen3 and DeepSeek-V3@tp8 GEMM1 widths
        a, b, a_s, b_s, ref, plain = block128_inputs(M, N, K, gen)
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        row = dict(M=M, N=N, K=K, tile="cublas", fp8_tflops=round(ceilings.fp8_tflops))
        _check_then_time(row, {"cublas_plain": run_cublas(a, b, c)}, c, plain, M * N * K, ceilings)
        print(json.dumps(row), flush=True)
        for block_m, block_n, warps, stages in ((64, 64, 4, 4), (64, 128, 4, 4), (128, 128, 8, 4)):
            row = dict(M=M, N=N, K=K, tile=f"{block_m}x{block_n}x128 w{warps} s{stages}",
                       fp8_tflops=round(ceilings.fp8_tflops))
            variants = {"triton": run_triton(a, b, a_s, b_s, c, block_m, block_n, warps, stages),
                        "gluon_sync": run_gluon(a, b, a_s, b_s, c, block_m, block_n, warps, stages, False),
                        "gluon_async": run_gluon(a, b, a_s, b_s, c, block_m, block_n, warps, stages, True)}
            _check_then_time(row, variants, c, ref, M * N * K, ceilings)
            _check_then_time(row, {"triton_plain": run_triton(a, b, a_s, b_s, c, block_m, block_n, warps, stages,
                                                              scaled=False)}, c, plain, M * N * K, ceilings)
            print(json.dumps(row), flush=True)


def _check_then_time(row: dict, variants: dict, c: torch.Tensor, ref: torch.Tensor, mnk: int, ceilings) -> None:
    """Each variant run into a NaN-filled c and checked against ref; if within 1e-2, timed."""
    for label, fn in variants.items():
        try:
            c.fill_(float("nan"))
            fn()
            err = ((c.float() - ref).norm() / ref.norm()).item()
            row[f"{label}_err"] = round(err, 5)
            if err < 1e-2:
                t = time_graph(fn, budget_s=0.3).median_us
                row[label] = round(t, 1)
                row[f"{label}_pct_fp8"] = round(2 * mnk / (t * 1e-6) / 1e12 / ceilings.fp8_tflops * 100, 1)
        except Exception as e:  # a variant that does not compile: say why, go on
            row[f"{label}_error"] = f"{type(e).__name__}: {str(e)[:300]}"


if __name__ == "__main__":
    main()
