"""A/B on a GPU: GEMM1 reading its weight tiles by TMA (``gemm1_tma``: a tensor descriptor of w13) against
pointer loads, each benchmark point at its best config of the runs the report of docs/kernels.md reads.
Where that config merges gate and up into one MMA (which has no TMA form), the unmerged config is timed
too. Each variant checked against the float32 reference first, timed twice interleaved (CUDA-graph
replay, L2 flushed, median us).

    PYTHONPATH=$PWD python3 scripts/gemm1_tma.py [MIN_M [MAX_M]] > rows.jsonl
"""

import json
import sys
from dataclasses import replace

from _points import best_rows, check_then_time, m_range, prefill_first

import moebench.kernels.fused_moe as kernels

best = best_rows("results/h200-kernels-6be41bd", "results/h200-kernels-6be41bd-ds4096",
                 "results/h200-kernels-1fd6e45/*-*", "results/h200-kernels-1694d9e/*-*",
                 "results/h200-kernels-b7f19ac/*-*")
for cfg, problem, inp, ref, out, row in prefill_first(best, *m_range(sys.argv[1:])):
    variants = {"base": (kernels, cfg), "tma": (kernels, replace(cfg, gemm1_merged=False, gemm1_tma=True))}
    if cfg.gemm1_merged:
        variants["unmerged"] = (kernels, replace(cfg, gemm1_merged=False))
    print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol)), flush=True)
