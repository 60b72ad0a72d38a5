"""A/B on a GPU: at the fp8-block128 points with a tile per slot, GEMM1 quantizing x in its K loop
(``FUSE_X_QUANT``) and the last split-K program of each chunk applying the activation (``FUSE_SPLIT_ACTIVATION``),
each alone and both, against neither (one launch each, as before). It runs on the tree of commit 6b8722e, where
both were module switches; the split-K one was slower and is gone, the x one became gemm1_quant_x. Each point at its best config of the
benchmark runs; each variant checked against the float32 reference first, timed twice interleaved (CUDA-graph
replay, L2 flushed, median us), keeping the faster.

    PYTHONPATH=$PWD python3 scripts/ab_session9.py > rows.jsonl
"""

import importlib.util
import json

from _points import best_rows, check_then_time, point_setup

import moebench.kernels.fused_moe as tree
from moebench.tile import TileConfig


def kernels_with(x_quant: bool, split_act: bool):
    """A separate copy of the working tree's kernels module with the two fusions set as given."""
    spec = importlib.util.spec_from_file_location(f"fm_{x_quant}_{split_act}", tree.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.FUSE_X_QUANT, module.FUSE_SPLIT_ACTIVATION = x_quant, split_act
    return module


modules = {"neither": kernels_with(False, False), "x_quant": kernels_with(True, False),
           "split_act": kernels_with(False, True), "both": kernels_with(True, True)}
best = best_rows("results/h200-kernels-6be41bd", "results/h200-kernels-1fd6e45/*-*")
for (model, dtype, m), r in sorted(best.items()):
    cfg = TileConfig.from_dict(r["config"])
    if dtype != "fp8-block128" or not cfg.direct_route:
        continue
    problem, inp, ref, out = point_setup(model, dtype, m)
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=round(r["time_us"], 1))
    variants = {label: (module, cfg) for label, module in modules.items()}
    print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol)), flush=True)
