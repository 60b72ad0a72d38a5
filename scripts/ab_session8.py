"""A/B on a GPU: the K loops without masks where the shapes divide the tiles, and one fp8-block128 weight
scale per tile and K step (``EVEN_K`` / ``EVEN_N``), against the kernels of commit 7b2e428; and, with a
tile per slot, GEMM1 warming L2 with GEMM2's weights (``PREFETCH_W2``, tried at commit 41ad4e5 and reverted
after: this script runs on the tree of that commit).

Each benchmark point runs at its best config of results/h200-kernels-6be41bd (and -ds4096, and the
fp8-block128 points of -1fd6e45): "base" (7b2e428's kernels), "new" (the working tree) and, where the
config has a tile per slot, "no_prefetch" (the working tree without the L2 prefetch), each checked
against the float32 reference first, timed twice interleaved, keeping the faster median.

    git show 7b2e428:moebench/kernels/fused_moe.py > .scratch/fused_moe_7b2.py
    PYTHONPATH=$PWD python3 scripts/ab_session8.py [point ...] > rows.jsonl

With arguments (regular expressions), only the points whose name ("model dtype M=m") one of them matches.
"""

import importlib.util
import json
import re
import sys

from _points import best_rows, check_then_time, point_setup, scratch_module

import moebench.kernels.fused_moe as new
from moebench.tile import TileConfig

base = scratch_module("fused_moe_7b2")
spec = importlib.util.spec_from_file_location("no_prefetch", new.__file__)  # a second copy of the tree's kernels
no_prefetch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(no_prefetch)
no_prefetch.PREFETCH_W2 = False

best = best_rows("results/h200-kernels-6be41bd", "results/h200-kernels-6be41bd-ds4096",
                 "results/h200-kernels-1fd6e45/*-*")
for (model, dtype, m), row in sorted(best.items(), key=lambda kv: (kv[0][1] != "fp8-block128", kv[0])):
    name = f"{model} {dtype} M={m}"
    if len(sys.argv) > 1 and not any(re.search(a, name) for a in sys.argv[1:]):
        continue
    cfg = TileConfig.from_dict(row["config"])
    problem, inp, ref, out = point_setup(model, dtype, m)
    result = dict(point=name, config=cfg.as_dict(), bench_us=row["time_us"])
    variants = {"base": (base, cfg), "new": (new, cfg)}
    if cfg.direct_route:
        variants["no_prefetch"] = (no_prefetch, cfg)
    print(json.dumps(check_then_time(result, variants, inp, out, ref, problem.spec.rtol)), flush=True)
