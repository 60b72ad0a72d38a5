"""Tile shapes at the fp8-block128 prefill points on a GPU, after the K loop lost its masks and per-column
weight scales: each config checked against the float32 reference, then timed (CUDA-graph replay, L2
flushed, median us), one JSON row per (point, config).

    PYTHONPATH=$PWD python3 scripts/block128_tiles.py > rows.jsonl
"""

import json

from _points import checked_error, layer, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.tile import TileConfig
from moebench.timing import time_graph

SHAPES = [  # (BLOCK_M, BLOCK_N, warps, stages, GEMM2 width)
    (64, 64, 4, 4, 128), (64, 64, 4, 3, 128), (64, 128, 8, 4, 0), (64, 128, 4, 3, 0),
    (128, 64, 8, 3, 128), (128, 64, 8, 4, 128), (128, 128, 8, 3, 0), (128, 64, 8, 3, 0),
]
POINTS = [("qwen3-30b-a3b", 1024), ("qwen3-30b-a3b", 4096), ("deepseek-v3@tp8", 1024), ("deepseek-v3@tp8", 4096)]

for model, m in POINTS:
    problem, inp, ref, out = point_setup(model, "fp8-block128", m)
    walk = 8 if model.startswith("deepseek") else 1  # GEMM2 of two K steps walks 8 column tiles (tuning.py)
    for bm, bn, warps, stages, n2 in SHAPES:
        cfg = TileConfig(bm, bn, 128, 8, warps, stages, atomic_sum=False, gemm2_block_n=n2, gemm2_n_tiles=walk)
        run = layer(kernels, inp, cfg, out)
        row = dict(point=f"{model} fp8-block128 M={m}", config=cfg.as_dict())
        try:
            row["err"] = round(checked_error(run, out, ref), 5)
            if row["err"] < problem.spec.rtol:
                row["time_us"] = round(time_graph(run, budget_s=0.3).median_us, 1)
        except Exception as e:  # out of shared memory or registers: say so, go on
            row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
        print(json.dumps(row), flush=True)
