"""Does Triton's automatic warp specialization (sm90) speed up a dense GEMM at the benchmark's prefill shapes?

A dense GEMM C[M, N] = A[M, K] . B[N, K]^T, operands by TMA descriptors, in three forms: bf16, fp8 e4m3
without scales, and fp8 with 128x128 block scales on B and 1x128 group scales on A (applied at every K
step, as moebench's fp8-block128 GEMMs do). Each form with ``warp_specialize`` on the K loop and without,
and torch's own GEMM (``torch.matmul`` / ``torch._scaled_mm``) at the same shape. The shapes are the
expert GEMMs of the prefill points with all slots of all experts stacked (an upper bound for the MoE
kernels, which gather rows). Each row is checked against a float32 product first, then timed by
``moebench.timing.time_graph``, 20 replays; the committed rows (results/h200-session14) were timed by this
script's own copy of that loop, whose flush was a zero fill.

    PYTHONPATH=$PWD python3 scripts/ws_dense.py --out $OUT/ws-dense.jsonl

On the H200 (triton 3.6; results/h200-session14) the warp-specialized kernels of 128-row tiles did not finish
(the runs reached their timeouts), and those of 64-row tiles ran at 0.5-0.7x the speed of the plain ones.

Also ``--compile-only`` (no GPU: compiles for sm90 and counts ``setmaxnreg`` in the PTX, which the
warp-specialized kernels use to give their producer warps fewer registers), and ``--gather`` (A's rows by pointer
loads through a random permutation, as the MoE GEMM1 reads its tokens, instead of by TMA). Under triton 3.9
(results/h200-session26) the 64-row warp-specialized tiles still ran at 0.48-0.72x the speed of the plain ones,
128-row 4-warp tiles did not compile with it, and with ``--gather`` no 4-warp tile did.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from moebench.timing import time_graph

# (label, M, N, K): Qwen3 GEMM1 / GEMM2 and DeepSeek-V3@tp8 GEMM1 / GEMM2 at M=4096 (32768 slots).
SHAPES = [
    ("qwen3-gemm1", 32768, 1536, 2048),
    ("qwen3-gemm2", 32768, 2048, 768),
    ("ds-gemm1", 32768, 512, 7168),
]
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
# Warp specialization applies to 4-warp tiles only (at 8 warps the PTX has no setmaxnreg): 8-warp tiles run plain.
TILES = [(64, 64, 128, 4, 4), (64, 128, 128, 4, 4), (128, 64, 128, 4, 4), (128, 128, 128, 4, 3), (128, 128, 64, 4, 4),
         (128, 256, 128, 4, 2), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3)]


@triton.jit
def _dense(a_desc, b_desc, c_ptr, a_scale_ptr, b_scale_ptr, a_ptr, rows_ptr, M, N, K, stride_cm, stride_asm,
           stride_bsn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
           SCALED: tl.constexpr, WS: tl.constexpr, GATHER: tl.constexpr):
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BLOCK_M)
    n_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * n_n)
    first_m = group * GROUP_M
    rows = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * n_n)) % rows
    pid_n = (pid % (GROUP_M * n_n)) // rows
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    offs_m = off_m + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    src_rows = offs_m  # [BLOCK_M]: the rows of A (and of its scales) this tile reads
    if GATHER:  # A's rows by pointer loads through a row index, as the MoE GEMM1 gathers its tokens
        src_rows = tl.load(rows_ptr + offs_m, mask=offs_m < M, other=0)
        offs_k = tl.arange(0, BLOCK_K)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), warp_specialize=WS):
        if GATHER:
            a = tl.load(a_ptr + src_rows[:, None].to(tl.int64) * K + k * BLOCK_K + offs_k[None, :])
        else:
            a = a_desc.load([off_m, k * BLOCK_K])  # [BLOCK_M, BLOCK_K]
        b = b_desc.load([off_n, k * BLOCK_K])  # [BLOCK_N, BLOCK_K]
        if SCALED:
            a_s = tl.load(a_scale_ptr + src_rows * stride_asm + (k * BLOCK_K) // 128)  # [BLOCK_M]
            # one weight scale per tile: right for BLOCK_N <= 128 only (128x256 tiles fail their check)
            b_s = tl.load(b_scale_ptr + (off_n // 128) * stride_bsn + (k * BLOCK_K) // 128)  # scalar
            acc += tl.dot(a, b.T) * (a_s[:, None] * b_s)
        else:
            acc = tl.dot(a, b.T, acc)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    ok = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc.to(c_ptr.dtype.element_ty), mask=ok)


def run_dense(a, b, a_s, b_s, tile, ws, scaled, poison=False, rows=None):
    """C = A . B^T; with ``rows`` (a permutation of A's rows), C's row i is A's row ``rows[i]`` times B^T."""
    M, K = a.shape
    N = b.shape[0]
    bm, bn, bk, warps, stages = tile
    c = torch.empty(M, N, device=a.device, dtype=torch.bfloat16)
    if poison:
        c.fill_(float("nan"))
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b, [bn, bk])
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    gather = rows is not None
    _dense[grid](a_desc, b_desc, c, a_s, b_s, a, rows if gather else a_s, M, N, K, c.stride(0), a_s.stride(0),
                 b_s.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, SCALED=scaled, WS=ws, GATHER=gather,
                 num_warps=warps, num_stages=stages)
    return c


def inputs(M, N, K, form, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a32 = torch.randn(M, K, device="cuda", generator=g)
    b32 = torch.randn(N, K, device="cuda", generator=g)
    if form == "bf16":
        a, b = a32.bfloat16(), b32.bfloat16()
        ones = torch.ones(1, 1, device="cuda")
        return a, b, ones, ones, a.float() @ b.float().T
    fp8 = torch.float8_e4m3fn
    if form == "fp8":
        a, b = a32.to(fp8), b32.to(fp8)
        ones = torch.ones(1, 1, device="cuda")
        return a, b, ones, ones, a.float() @ b.float().T
    # fp8-block128: group scales on A, block scales on B
    a_s = torch.rand(M, K // 128, device="cuda", generator=g) + 0.5
    b_s = torch.rand(triton.cdiv(N, 128), K // 128, device="cuda", generator=g) + 0.5
    a, b = a32.to(fp8), b32.to(fp8)
    a_deq = a.float() * a_s.repeat_interleave(128, 1)
    b_deq = b.float() * b_s.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)
    return a, b, a_s, b_s, a_deq @ b_deq.T


def torch_fn(a, b, form):
    if form == "bf16":
        return lambda: a @ b.T
    one = torch.ones((), device="cuda")
    return lambda: torch._scaled_mm(a, b.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def compile_only(gather=False):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for form, dt in (("bf16", "bf16"), ("fp8", "fp8e4nv"), ("block128", "fp8e4nv")):
        for bm, bn, bk, warps, stages in TILES:
            for ws in (False, True):
                sig = {n: "i32" for n in _dense.arg_names}
                sig.update(a_desc=f"tensordesc<{dt}[{bm}, {bk}]>", b_desc=f"tensordesc<{dt}[{bn}, {bk}]>",
                           c_ptr="*bf16", a_scale_ptr="*fp32", b_scale_ptr="*fp32", a_ptr=f"*{dt}", rows_ptr="*i32")
                c = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, SCALED=form == "block128", WS=ws,
                         GATHER=gather)
                for n in c:
                    sig[n] = "constexpr"
                try:
                    src = ASTSource(fn=_dense, signature=sig, constexprs=c)
                    opts = dict(num_warps=warps, num_stages=stages)
                    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
                    ptx = k.asm["ptx"]
                    print(form, (bm, bn, bk), "ws" if ws else "--", "setmaxnreg", ptx.count("setmaxnreg"),
                          "wgmma", ptx.count("wgmma.mma_async"), "wait_group", sorted(set(
                              l.split()[-1] for l in ptx.splitlines() if "wgmma.wait_group" in l)))
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(form, (bm, bn, bk), "ws" if ws else "--", "ERR", str(e).strip().splitlines()[-1][:160])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--shape", default=None, help="one shape label (default: all)")
    p.add_argument("--form", default=None, help="bf16, fp8 or block128 (default: all)")
    p.add_argument("--tile", default=None, help="BMxBNxBK-warps-stages, e.g. 128x128x128-4-3 (default: all)")
    p.add_argument("--ws", choices=("on", "off"), default=None, help="only with / without warp specialization")
    p.add_argument("--no-torch", action="store_true", help="skip torch's GEMM")
    p.add_argument("--gather", action="store_true",
                   help="load A's rows by pointers through a random permutation (as the MoE GEMM1), not by TMA")
    args = p.parse_args()
    if args.compile_only:
        compile_only(args.gather)
        return
    peak = {"bf16": 790e12, "fp8": 1460e12, "block128": 1460e12}
    rows = []
    sink = open(args.out, "a") if args.out else None
    tiles = TILES
    if args.tile:
        dims, warps, stages = args.tile.split("-")
        tiles = [tuple(int(v) for v in dims.split("x")) + (int(warps), int(stages))]
    for label, M, N, K in SHAPES:
        if args.shape and label != args.shape:
            continue
        for form in ("bf16", "fp8", "block128"):
            if args.form and form != args.form:
                continue
            a, b, a_s, b_s, ref = inputs(M, N, K, form)
            perm = None  # [M] int32: the row of A each row of C reads, with --gather
            if args.gather:
                perm = torch.randperm(M, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
                perm = perm.to(torch.int32)
                ref = ref[perm.long()]
            flops = 2 * M * N * K
            if form != "block128" and not args.no_torch:
                t = time_graph(torch_fn(a, b, form), min_reps=20, max_reps=20).median_us
                rows.append(dict(shape=label, form=form, kernel="torch", time_us=t, tflops=flops / t / 1e6))
                if sink:
                    sink.write(json.dumps(rows[-1]) + "\n")
            for tile in tiles:
                for ws in (False, True) if tile[3] == 4 else (False,):
                    if args.ws and ws != (args.ws == "on"):
                        continue
                    row = dict(shape=label, form=form, kernel="ws" if ws else "plain", gather=args.gather,
                               triton=triton.__version__,
                               tile="x".join(map(str, tile[:3])), warps=tile[3], stages=tile[4])
                    try:
                        launch = functools.partial(run_dense, a, b, a_s, b_s, tile, ws, form == "block128", rows=perm)
                        c = launch(poison=True)
                        err = ((c.float() - ref).norm() / ref.norm()).item()
                        if not err < 2e-2:
                            raise RuntimeError(f"relative error {err:.3g}")
                        t = time_graph(launch, min_reps=20, max_reps=20).median_us
                        row.update(time_us=t, tflops=flops / t / 1e6, pct_peak=flops / t / 1e6 / (peak[form] / 1e12))
                    except Exception as e:  # noqa: BLE001 - a tile that fails is a row with its error
                        row.update(error=str(e).strip().splitlines()[-1][:200])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if sink:
                        sink.write(json.dumps(row) + "\n")
                        sink.flush()
    best = {}
    for r in rows:
        if "time_us" in r:
            key = (r["shape"], r["form"], r["kernel"])
            if key not in best or r["time_us"] < best[key]["time_us"]:
                best[key] = r
    print(f"{'shape':12} {'form':9} {'torch':>14} {'plain':>22} {'ws':>22}")
    for label, *_ in SHAPES:
        for form in ("bf16", "fp8", "block128"):
            cells = []
            for kern in ("torch", "plain", "ws"):
                r = best.get((label, form, kern))
                cells.append("-" if r is None else f"{r['time_us']:.1f}us {r['tflops']:.0f}T {r.get('tile', '')}")
            print(f"{label:12} {form:9} {cells[0]:>14} {cells[1]:>22} {cells[2]:>22}")


if __name__ == "__main__":
    main()
