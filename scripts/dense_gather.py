"""What do the MoE GEMMs' gathered activation rows cost at fp8-block128 prefill? Dense bounds, on a GPU.

moebench's GEMM1 reads each tile's activation rows by pointer loads from x (a token's row for each of its
slots, in the align step's order); a kernel whose rows were contiguous could read them by TMA. This script
times one GEMM of the shape of a prefill point's GEMM1 with all slots stacked, C = A . B^T with 128x128 block
scales applied at every K step (as moebench's fp8-block128 GEMMs do), 64-row tiles at 4 warps, with A read:

- ``tma``: by a TMA descriptor, the tile's rows contiguous;
- ``ptr``: by pointer loads, the same contiguous rows;
- ``gather``: by pointer loads of the rows that a uniform routing's slots, sorted by expert, point at (what the
  MoE kernels read): GEMM1 a token's row of x [slots / topk, K] per slot, GEMM2 a slot's row of h [slots, I];

and B as one 128-row tile with one block scale (``one``), or as GEMM1's gate and up tiles of 64 rows each,
two MMAs and two scales per K step (``pair``, as the MoE kernel at its 64x64 tiles). B always by TMA. With
``--cublas``, each shape also gets cuBLAS's GEMMs over the contiguous rows (``torch._scaled_mm``: with the 1x128
and 128x128 scales, and without scales), its bf16 C in a tensor of its own. Each variant is checked against a
float32 product, then timed (``moebench.timing.time_graph``); the first line has the ceilings measured in the
same run, whose fp8 rate the ``pct_fp8`` column is of.

    PYTHONPATH=$PWD python3 scripts/dense_gather.py [--shapes qwen3-gemm2,ds-gemm2] [--cublas] > rows.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gluon_block128 import cublas_plain  # scripts beside this one
from gluon_overlap import cublas_block
from moebench.roofline import measure_ceilings
from moebench.timing import time_graph

# (label, slots, N, K, topk): Qwen3 and DeepSeek-V3@tp8 GEMM1 (N = 2I) at M=4096, whose gathered rows are tokens'
# (x [slots / topk, K]), and their GEMM2 (topk None: N = hidden, K = I), whose gathered rows are slots' (h [slots, K]).
SHAPES = [("qwen3-gemm1", 32768, 1536, 2048, 8), ("ds-gemm1", 32768, 512, 7168, 8),
          ("qwen3-gemm2", 32768, 2048, 768, None), ("ds-gemm2", 32768, 7168, 256, None)]


@triton.jit
def _gemm(a_desc, a_ptr, rows_ptr, b_desc, c_ptr, a_scale_ptr, b_scale_ptr, M, N, K, stride_am, stride_cm,
          stride_asm, stride_bsn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          A_FORM: tl.constexpr, PAIR: tl.constexpr):
    """C[M, N] tile: with PAIR, columns [n, n + BN/2) of the gate half and the same of the up half (N/2 on)."""
    n_n = tl.cdiv(N, BLOCK_N)
    pid_m = tl.program_id(0) // n_n
    pid_n = tl.program_id(0) % n_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(rows_ptr + offs_m) if A_FORM == 2 else offs_m  # [BM] the rows of A (of x, gathered)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    HALF: tl.constexpr = BLOCK_N // 2
    n0 = pid_n * HALF
    acc_g = tl.zeros((BLOCK_M, HALF if PAIR else BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if A_FORM == 0:
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        else:
            a = tl.load(a_ptrs)
        a_s = tl.load(a_scale_ptr + rows * stride_asm + k)  # [BM]
        if PAIR:
            g = b_desc.load([n0, k * BLOCK_K])  # [BN/2, BK]
            u = b_desc.load([N // 2 + n0, k * BLOCK_K])
            g_s = tl.load(b_scale_ptr + (n0 // 128) * stride_bsn + k)
            u_s = tl.load(b_scale_ptr + ((N // 2 + n0) // 128) * stride_bsn + k)
            acc_g += tl.dot(a, g.T) * (a_s * g_s)[:, None]
            acc_u += tl.dot(a, u.T) * (a_s * u_s)[:, None]
        else:
            b = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K])  # [BN, BK]
            b_s = tl.load(b_scale_ptr + (pid_n * BLOCK_N // 128) * stride_bsn + k)
            acc_g += tl.dot(a, b.T) * (a_s * b_s)[:, None]
        a_ptrs += BLOCK_K
    if PAIR:
        offs_g = n0 + tl.arange(0, HALF)
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_g[None, :], acc_g.to(c_ptr.dtype.element_ty))
        tl.store(c_ptr + offs_m[:, None] * stride_cm + (N // 2 + offs_g)[None, :], acc_u.to(c_ptr.dtype.element_ty))
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc_g.to(c_ptr.dtype.element_ty))


def _timed(label: str, name: str, fn, c: torch.Tensor, ref: torch.Tensor, flops: int, fp8_rate: float,
           returns: bool = False, **extra):
    """Run ``fn`` into the NaN-filled ``c`` (or, ``returns``, take its result), check it against ``ref``, time it
    and print a JSON row."""
    c.fill_(float("nan"))
    out = fn()
    result = out if returns else c
    err = ((result.float() - ref).norm() / ref.norm()).item()
    t = time_graph(fn, budget_s=0.3).median_us
    print(json.dumps(dict(shape=label, a=name, **extra, err=round(err, 5), time_us=round(t, 1),
                          tflops=round(flops / t / 1e6), pct_fp8=round(100 * flops / (t * 1e-6) / fp8_rate, 1))),
          flush=True)


def gather_inputs(slots: int, N: int, K: int, topk: int | None, g: torch.Generator):
    """Fp8 operands of one shape of SHAPES and their float32 product, as the MoE kernels see them.

    Returns x8 [rows, K] fp8 (x, or h for GEMM2), x_s [rows, K/128] its 1x128 scales, tok [slots] int32 the row
    of x8 each sorted slot reads, gathered [slots, K] fp8 and a_s [slots, K/128] those rows and scales stacked
    contiguous, b [N, K] fp8, b_s [N/128, K/128] its 128x128 scales, and ref [slots, N] float32."""
    fp8 = torch.float8_e4m3fn
    rows_of_x = slots // topk if topk else slots
    x = torch.randn(rows_of_x, K, device="cuda", generator=g)
    x_s = torch.rand(rows_of_x, K // 128, device="cuda", generator=g) + 0.5
    # a uniform routing's slots in expert order: slot s is token s // topk; sorted by a random expert each
    order = torch.argsort(torch.randint(0, 128, (slots,), device="cuda", generator=g), stable=True)
    tok = (order // topk if topk else order).to(torch.int32)  # [slots] the row of x of each sorted slot
    gathered = x[tok.long()].to(fp8).contiguous()  # [slots, K] A as the tiles see it, contiguous
    a_s = x_s[tok.long()].contiguous()
    b = torch.randn(N, K, device="cuda", generator=g).to(fp8)
    b_s = torch.rand(N // 128, K // 128, device="cuda", generator=g) + 0.5
    a_deq = gathered.float() * a_s.repeat_interleave(128, 1)
    ref = a_deq @ (b.float() * b_s.repeat_interleave(128, 0).repeat_interleave(128, 1)).T
    return x.to(fp8), x_s, tok, gathered, a_s, b, b_s, ref


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(s[0] for s in SHAPES), help="comma-separated labels of SHAPES")
    p.add_argument("--cublas", action="store_true", help="also cuBLAS's GEMMs over the contiguous rows")
    args = p.parse_args()
    wanted = args.shapes.split(",")
    unknown = sorted(set(wanted) - {s[0] for s in SHAPES})
    if unknown:
        p.error(f"unknown shapes {unknown}; known: {[s[0] for s in SHAPES]}")
    ceilings = measure_ceilings()
    print(json.dumps(dict(ceilings=ceilings.as_dict())), flush=True)
    fp8_rate = ceilings.fp8_tflops * 1e12
    g = torch.Generator(device="cuda").manual_seed(0)
    for label, slots, N, K, topk in (s for s in SHAPES if s[0] in wanted):
        x8, x_s, tok, gathered, a_s, b, b_s, ref = gather_inputs(slots, N, K, topk, g)
        ident = torch.arange(slots, device="cuda", dtype=torch.int32)
        c = torch.empty(slots, N, device="cuda", dtype=torch.bfloat16)
        if args.cublas:
            plain_ref = gathered.float() @ b.float().T
            block = cublas_block(gathered, b, a_s, b_s, ref)
            if block is None:
                print(json.dumps(dict(shape=label, a="cublas_block", error="no scale layout this torch takes gives "
                                      "the float32 product")), flush=True)
            else:
                _timed(label, "cublas_block", block, c, ref, 2 * slots * N * K, fp8_rate, returns=True)
            _timed(label, "cublas_plain", cublas_plain(gathered, b), c, plain_ref, 2 * slots * N * K, fp8_rate,
                   returns=True)
        for stages in (3, 4):
            for pair in (False, True) if topk else (False,):
                for form, name in enumerate(("tma", "ptr", "gather")):
                    bm, bn, bk = 64, 128, 128
                    a_src, rows, a_scale = (x8, tok, x_s) if form == 2 else (gathered, ident, a_s)
                    a_desc = TensorDescriptor.from_tensor(gathered, [bm, bk])
                    b_desc = TensorDescriptor.from_tensor(b, [bn // 2 if pair else bn, bk])

                    launch = functools.partial(
                        _gemm[(slots // bm * (N // bn),)], a_desc, a_src, rows, b_desc, c, a_scale, b_s, slots, N, K,
                        a_src.stride(0), c.stride(0), a_scale.stride(0), b_s.stride(0), BLOCK_M=bm, BLOCK_N=bn,
                        BLOCK_K=bk, A_FORM=form, PAIR=pair, num_warps=4, num_stages=stages)
                    _timed(label, name, launch, c, ref, 2 * slots * N * K, fp8_rate, b="pair" if pair else "one",
                           stages=stages)


if __name__ == "__main__":
    main()
