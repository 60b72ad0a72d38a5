"""A/B on a GPU at the points whose best config of results/h200-kernels-3560e62 has a tile per slot:
"base", commit e0f31fe's kernels (GEMMs and the split-K activation launch as programmatic dependents),
against "new", the working tree, where the activation quantization and the top-k sum launches are
dependents too. Layer time (graph replay, median, L2 flushed), each variant checked against the
float32 reference first, timed twice interleaved, keeping the faster median.

    git show e0f31fe:moebench/kernels/fused_moe.py > .scratch/fused_moe_e0.py
    PYTHONPATH=$PWD python3 scripts/ab_session6_pdl_all.py > rows.jsonl
"""

import json

from _points import best_rows, check_then_time, point_setup, scratch_module

import moebench.kernels.fused_moe as new
from moebench.tile import TileConfig

base = scratch_module("fused_moe_e0")
best = best_rows("results/h200-kernels-3560e62")

for (model, dtype, m), row in sorted(best.items()):
    cfg = TileConfig.from_dict(row["config"])
    if not cfg.direct_route:
        continue
    problem, inp, ref, out = point_setup(model, dtype, m)
    result = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=row["time_us"])
    print(json.dumps(check_then_time(result, {"base": (base, cfg), "new": (new, cfg)}, inp, out, ref,
                                     problem.spec.rtol)), flush=True)
