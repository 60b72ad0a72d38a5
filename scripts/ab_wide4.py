"""A/B on a GPU: a 128x64 tile at 4 warps with GEMM1 as one merged MMA (an MMA 128 rows by 128 columns: 64
gate and 64 up), at the bf16 and fp8-tensor prefill points, against each point's best config of the runs the
report of docs/kernels.md reads ("base"; ``_points.REPORT_RUNS``).

Why: a dense GEMM of Qwen3's GEMM1 shape (32768 x 1536 x 2048, bf16, TMA) ran at 670 TFLOP/s as one 128x128x64
tile at 4 warps and 4 stages, and at 601 TFLOP/s as 128x256x64 at 8 warps, the dense analog of the best GEMM1
tile at these points (128x128 at 8 warps, merged: an MMA 128 by 256) (scripts/ws_dense.py, session 14). The
tuner's prefill class has no 4-warp tile of 128 rows and tries merged MMAs only at 8 warps.

Variants, each on the base config's K step for its dtype, no Swap-AB, GROUP_SIZE_M 8, merged:
"w4" GEMM2 at GEMM1's width (64) with the base's top-k sum; "w4_n2" GEMM2 at 128 columns; "w4_out" and
"w4_n2_out" the same with the sum into the output; "w4_stored" with the stored rows. Each checked against
the float32 reference first (``*_err``), timed twice interleaved (CUDA-graph replay, L2 flushed, median us).

    PYTHONPATH=$PWD python3 scripts/ab_wide4.py [MIN_M [MAX_M]] > rows.jsonl
"""

import json
import sys
from dataclasses import replace

from _points import REPORT_RUNS, best_rows, check_then_time, m_range, prefill_first

import moebench.kernels.fused_moe as kernels

best = best_rows(*REPORT_RUNS)
best = {k: v for k, v in best.items() if k[1] in ("bf16", "fp8-tensor")}
lo, hi = m_range(sys.argv[1:] or ["1024"])
for cfg, problem, inp, ref, out, row in prefill_first(best, lo, hi):
    k = 128 if problem.spec.is_fp8 else 64
    w4 = replace(cfg, BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_K=k, GROUP_SIZE_M=8, num_warps=4, num_stages=4,
                 swap_ab=False, gemm1_merged=True, gemm2_block_n=0, gemm2_n_tiles=1, gemm1_tma=False)
    n2 = replace(w4, gemm2_block_n=128)
    into_out = dict(atomic_sum=True, atomic_out=True)
    variants = {"base": (kernels, cfg), "w4": (kernels, w4), "w4_n2": (kernels, n2),
                "w4_out": (kernels, replace(w4, **into_out)), "w4_n2_out": (kernels, replace(n2, **into_out)),
                "w4_stored": (kernels, replace(w4, atomic_sum=False, atomic_out=False))}
    print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol)), flush=True)
