"""A/B on a GPU: GEMM1 as one merged MMA per K step (``gemm1_merged``) at fp8-block128 prefill tiles of 4 warps.

The tuner tries the merged MMA for 8-warp tiles and not at fp8-block128. Each fp8-block128 point of M >= 256 whose
best config (``_points.REPORT_RUNS``) uses the align step runs at that config ("base"), merged ("merged"; without
TMA weights, which the merged MMA does not take) and, where the best config reads its weights by TMA, at the
config without TMA ("pointer", the merged form's own baseline). Each variant checked against the float32
reference first (``*_err``), timed twice interleaved (CUDA-graph replay, L2 flushed, median us), the faster kept.

    PYTHONPATH=$PWD python3 scripts/ab_merged_block128.py [MIN_M [MAX_M]] > rows.jsonl
"""

import json
import sys
from dataclasses import replace

from _points import REPORT_RUNS, best_rows, check_then_time, m_range, prefill_first

import moebench.kernels.fused_moe as kernels

lo, hi = m_range(sys.argv[1:])
best = {key: row for key, row in best_rows(*REPORT_RUNS).items()
        if key[1] == "fp8-block128" and not row["config"].get("direct_route")}
for cfg, problem, inp, ref, out, row in prefill_first(best, max(lo, 256), hi):
    variants = {"base": (kernels, cfg), "merged": (kernels, replace(cfg, gemm1_tma=False, gemm1_merged=True))}
    if cfg.gemm1_tma:
        variants["pointer"] = (kernels, replace(cfg, gemm1_tma=False))
    row = check_then_time(row, variants, inp, out, ref, problem.spec.rtol)
    print(json.dumps(row), flush=True)
