"""A/B on a GPU: GEMM2 at 256 output columns per tile (``gemm2_block_n=256``) against each bf16 and fp8-tensor
prefill point's best config, whose GEMM2 runs GEMM1's 64 or 128. GEMM2's A tile (the activation h) is read from
L2 once per column tile, so twice as wide a tile reads it half as often. Each variant checked against the
float32 reference first, timed twice interleaved (CUDA-graph replay, L2 flushed, median us).

    PYTHONPATH=$PWD python3 scripts/gemm2_wide.py > rows.jsonl
"""

import json
from dataclasses import replace

from _points import best_rows, check_then_time, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.tile import TileConfig

best = best_rows("results/h200-kernels-6be41bd")
for (model, dtype, m), r in sorted(best.items()):
    if dtype not in ("bf16", "fp8-tensor") or m < 1024:
        continue
    cfg = TileConfig.from_dict(r["config"])
    problem, inp, ref, out = point_setup(model, dtype, m)
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=round(r["time_us"], 1))
    variants = {"base": (kernels, cfg), "n2_256": (kernels, replace(cfg, gemm2_block_n=256))}
    print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol)), flush=True)
