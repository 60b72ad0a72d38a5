"""A/B on a GPU: GEMM2 at 256 output columns per tile (``gemm2_block_n=256``) against each bf16 and fp8-tensor
prefill point's best config, whose GEMM2 runs GEMM1's 64 or 128. GEMM2's A tile (the activation h) is read from
L2 once per column tile, so twice as wide a tile reads it half as often. Each variant checked against the
float32 reference first, timed twice interleaved (CUDA-graph replay, L2 flushed, median us).

    PYTHONPATH=$PWD python3 scripts/gemm2_wide.py [--all] > rows.jsonl

With ``--all``: every point of M >= 256 that uses the align step (fp8-block128 too), at its best config of
all the benchmark runs, with GEMM2 at 128 columns (where GEMM1's tile is narrower) and at 256.
"""

import json
import sys
from dataclasses import replace

from _points import best_rows, check_then_time, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.tile import TileConfig

ALL = "--all" in sys.argv[1:]
runs = ("results/h200-kernels-6be41bd", "results/h200-kernels-6be41bd-ds4096", "results/h200-kernels-1fd6e45/*-*",
        "results/h200-kernels-b7f19ac/*-*") if ALL else ("results/h200-kernels-6be41bd",)
best = best_rows(*runs)
for (model, dtype, m), r in sorted(best.items()):
    cfg = TileConfig.from_dict(r["config"])
    if ALL and (m < 256 or cfg.direct_route or cfg.gemm2_block_n == 256):
        continue
    if not ALL and (dtype not in ("bf16", "fp8-tensor") or m < 1024):
        continue
    problem, inp, ref, out = point_setup(model, dtype, m)
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=round(r["time_us"], 1))
    variants = {"base": (kernels, cfg), "n2_256": (kernels, replace(cfg, gemm2_block_n=256))}
    if ALL and cfg.block_n2 < 128:
        variants["n2_128"] = (kernels, replace(cfg, gemm2_block_n=128))
    print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol)), flush=True)
