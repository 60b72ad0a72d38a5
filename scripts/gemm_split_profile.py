"""Per-GEMM GPU time (PyTorch profiler) of many tile configs at a few prefill points: would GEMM1 and
GEMM2 gain from tile configs of their own? Prints one JSON line per (point, config).

    PYTHONPATH=$PWD python3 scripts/gemm_split_profile.py > rows.jsonl

results/h200-gemm-split was made at commit fcd928f, when fp8-block128 had a second accumulation
form (``rescale``: true rows); that form is gone, the script now times the one that remains.
"""

import json

from moebench.models import get_model, shard
from moebench.problem import Problem
from moebench.profile import kernel_breakdown
from moebench.tile import TileConfig, fit_stages

POINTS = [("deepseek-v3", 8, "fp8-block128", 4096), ("qwen3-30b-a3b", 1, "fp8-block128", 4096),
          ("qwen3-30b-a3b", 1, "bf16", 4096), ("mixtral-8x7b", 1, "bf16", 4096)]

for name, tp, dtype, m in POINTS:
    shape = shard(get_model(name), tp=tp)
    problem = Problem(shape, m, dtype)
    block_k = 128 if dtype != "bf16" else 64
    shapes = ((64, 64, 4), (64, 128, 4), (64, 128, 8), (64, 256, 8), (128, 64, 4), (128, 128, 8), (128, 256, 8))
    for bm, bn, warps in shapes:
        cfg = fit_stages(TileConfig(bm, bn, block_k, 8, warps, 4, atomic_sum=False), problem.spec.weight_bytes)
        point = dict(point=f"{name}@{tp} {dtype} {m}", bm=bm, bn=bn, warps=warps)
        try:
            rows = kernel_breakdown(problem, "triton", cfg, reps=3)
        except Exception as e:  # out of resources for a tile: say so and go on
            print(json.dumps(dict(**point, error=str(e)[:80])), flush=True)
            continue
        us = {r["kernel"]: round(r["us"], 1) for r in rows}
        print(json.dumps(dict(**point, stages=cfg.num_stages, gemm1=us.get("_gemm1_swiglu"),
                              gemm2=us.get("_gemm2_combine"), total=us.get("total"))), flush=True)
