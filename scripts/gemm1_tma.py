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

from _points import best_rows, check_then_time, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.tile import TileConfig

lo, hi = (int(a) for a in sys.argv[1:] + ["1", "1000000"][len(sys.argv[1:]):])
best = best_rows("results/h200-kernels-6be41bd", "results/h200-kernels-6be41bd-ds4096",
                 "results/h200-kernels-1fd6e45/*-*", "results/h200-kernels-1694d9e/*-*",
                 "results/h200-kernels-b7f19ac/*-*")
for (model, dtype, m), r in sorted(best.items(), key=lambda kv: (-kv[0][2], kv[0][0], kv[0][1])):
    if not lo <= m <= hi:
        continue
    cfg = TileConfig.from_dict(r["config"])
    problem, inp, ref, out = point_setup(model, dtype, m)
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=round(r["time_us"], 1))
    variants = {"base": (kernels, cfg), "tma": (kernels, replace(cfg, gemm1_merged=False, gemm1_tma=True))}
    if cfg.gemm1_merged:
        variants["unmerged"] = (kernels, replace(cfg, gemm1_merged=False))
    print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol)), flush=True)
