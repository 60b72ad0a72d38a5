"""A/B on a GPU: the K loops without masks where the shapes divide the tiles, and one fp8-block128 weight
scale per tile and K step (``EVEN_K`` / ``EVEN_N``), against the kernels of commit 7b2e428.

Each benchmark point runs at its best config of results/h200-kernels-6be41bd (and -ds4096): "base"
(7b2e428's kernels) and "new" (the working tree), each checked against the float32 reference first,
timed twice interleaved, keeping the faster median.

    git show 7b2e428:moebench/kernels/fused_moe.py > .scratch/fused_moe_7b2.py
    PYTHONPATH=$PWD python3 scripts/ab_session8.py [point ...] > rows.jsonl

With arguments, only the points whose name ("model dtype M=m") contains one of them.
"""

import json
import sys

from _points import best_rows, check_then_time, point_setup, scratch_module

import moebench.kernels.fused_moe as new
from moebench.tile import TileConfig

base = scratch_module("fused_moe_7b2")

best = best_rows("results/h200-kernels-6be41bd", "results/h200-kernels-6be41bd-ds4096")
for (model, dtype, m), row in sorted(best.items(), key=lambda kv: (kv[0][1] != "fp8-block128", kv[0])):
    name = f"{model} {dtype} M={m}"
    if len(sys.argv) > 1 and not any(a in name for a in sys.argv[1:]):
        continue
    cfg = TileConfig.from_dict(row["config"])
    problem, inp, ref, out = point_setup(model, dtype, m)
    result = dict(point=name, config=cfg.as_dict(), bench_us=row["time_us"])
    print(json.dumps(check_then_time(result, {"base": (base, cfg), "new": (new, cfg)}, inp, out, ref,
                                     problem.spec.rtol)), flush=True)
