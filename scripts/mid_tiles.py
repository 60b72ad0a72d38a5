"""Token tiles of 16 and 32 rows at the M = 1024 points with 64 slots per expert (Qwen3), on a GPU.

With uniform routing an expert gets 64 +- 8 of Qwen3's 8192 slots at M = 1024, so 64-row tiles run about half
the experts with a second, mostly empty, tile (about 1.5 tile rows per real row); 32-row tiles about 1.25 and
16-row tiles about 1.07, at the price of reading each weight tile once per row tile (from L2 mostly). The
tuner's class for 64 slots per expert has 64- and 128-row tiles only. Each config checked against the
float32 reference, then timed twice interleaved (CUDA-graph replay, L2 flushed, median us), against the
point's best config of the benchmark runs.

    PYTHONPATH=$PWD python3 scripts/mid_tiles.py > rows.jsonl
"""

import json

from _points import best_rows, check_then_time, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.tile import TileConfig, fit_stages

best = best_rows("results/h200-kernels-6be41bd", "results/h200-kernels-1fd6e45/*-*")
SHAPES = [(32, 128, 4, 3), (32, 64, 4, 4), (16, 128, 4, 3), (16, 64, 4, 4)]  # (BLOCK_M, BLOCK_N, warps, stages)
for model, dtype in [("qwen3-30b-a3b", "fp8-block128"), ("qwen3-30b-a3b", "bf16")]:
    problem, inp, ref, out = point_setup(model, dtype, 1024)
    base = TileConfig.from_dict(best[(model, dtype, 1024)]["config"])
    variants = {"best": (kernels, base)}
    bk = 128 if dtype == "fp8-block128" else 64
    for (bm, bn, warps, stages), swap in [(s, w) for s in SHAPES for w in (True, False)]:
        cfg = fit_stages(TileConfig(bm, bn, bk, 8, warps, stages, swap_ab=swap, atomic_sum=False),
                         problem.spec.weight_bytes)
        variants[f"{bm}x{bn}{' swap' if swap else ''}"] = (kernels, cfg)
    row = dict(point=f"{model} {dtype} M=1024", best_config=base.as_dict(),
               configs={k: c.as_dict() for k, (_, c) in variants.items()})
    print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol)), flush=True)
