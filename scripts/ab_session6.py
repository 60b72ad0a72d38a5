"""A/B on a GPU, layer time (graph replay, median, L2 flushed) at each point's best config of the current
benchmark run folders, each variant checked against the float32 reference first.

Kernel files compared:
- "base": commit b54dfd9's kernels (``git show b54dfd9:moebench/kernels/fused_moe.py >
  .scratch/fused_moe_head.py``), GEMM1 with a gate MMA and an up MMA per K step;
- "new": the working tree, GEMM1 with one MMA per K step over a B tile of gate and up rows side by side.

At the prefill points (M >= 256) "new" also runs at tiles the merged MMA may suit better: "m128" (BLOCK_M
128, 8 warps) and "n128" (BLOCK_N 128, 8 warps), the rest of the config as the best one. Each variant is
timed twice, interleaved with the others, and keeps the faster median.

    PYTHONPATH=$PWD python3 scripts/ab_session6.py > rows.jsonl
"""

import json
from dataclasses import replace

from _points import best_rows, check_then_time, point_setup, scratch_module

import moebench.kernels.fused_moe as new
from moebench.tile import TileConfig, fit_stages

RUNS = ["results/h200-kernels-fd59e5b", "results/h200-kernels-0c6f1ed/*/", "results/h200-kernels-cb3a072/*/",
        "results/h200-kernels-decode-walk/*/"]
base = scratch_module("fused_moe_head")

best = best_rows(*RUNS)


def measure(model: str, dtype: str, m: int) -> dict:
    problem, inp, ref, out = point_setup(model, dtype, m)
    cfg = TileConfig.from_dict(best[(model, dtype, m)]["config"])
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=best[(model, dtype, m)]["time_us"])
    variants = {"base": (base, cfg), "new": (new, cfg)}
    if m >= 256:
        bytes_ = problem.spec.weight_bytes
        variants["m128"] = (new, fit_stages(replace(cfg, BLOCK_SIZE_M=128, num_warps=8), bytes_))
        variants["n128"] = (new, fit_stages(replace(cfg, BLOCK_SIZE_N=128, num_warps=8), bytes_))
    return check_then_time(row, variants, inp, out, ref, problem.spec.rtol)


for model, dtype, m in sorted(best):
    print(json.dumps(measure(model, dtype, m)), flush=True)
