"""A/B on a GPU: GEMM1 quantizing h in its epilogue at fp8-block128 where its tiles are 128 columns wide
(each tile row one 1x128 group of h), against the kernels of commit 692dd05, where a launch after GEMM1
quantized h.

Each fp8-block128 benchmark point of M >= 4 runs at its best config of the runs the report of
docs/kernels.md reads (``_points.REPORT_RUNS``; the committed rows were made when its last were those of
31c76a7) ("base"), and with 128-wide tiles (8 warps from 64 rows, as the tuner gives them;
stages fitted to shared memory; GEMM2 at GEMM1's width): "w128_launch" on 692dd05's kernels (GEMM1 writes
h in bf16, a launch quantizes it) and "w128" on the working tree's (GEMM1 writes fp8 h and its scales). Each
variant checked against the float32 reference first (``*_err``), timed twice interleaved (CUDA-graph replay,
L2 flushed, median us), the faster kept.

    git show 692dd05:moebench/kernels/fused_moe.py > .scratch/fused_moe_head.py
    PYTHONPATH=$PWD python3 scripts/ab_session12.py [MIN_M [MAX_M]] > rows.jsonl
"""

import json
import sys
from dataclasses import replace

from _points import REPORT_RUNS, best_rows, check_then_time, m_range, prefill_first, scratch_module

import moebench.kernels.fused_moe as kernels
from moebench.tile import fit_stages

head = scratch_module("fused_moe_head")
best = best_rows(*REPORT_RUNS)
best = {key: row for key, row in best.items() if key[1] == "fp8-block128"}
for cfg, problem, inp, ref, out, row in prefill_first(best, *m_range(sys.argv[1:])):
    variants = {"base": (kernels, cfg)}
    if cfg.split_k == 1:
        wide = replace(cfg, BLOCK_SIZE_N=128, gemm2_block_n=0, num_stages=4,
                       num_warps=8 if cfg.BLOCK_SIZE_M >= 64 else cfg.num_warps)
        wide = fit_stages(wide, problem.spec.weight_bytes)
        row["w128_config"] = wide.as_dict()
        variants["w128_launch"] = (head, wide)
        variants["w128"] = (kernels, wide)
    print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol)), flush=True)
