"""Layer time on a GPU (graph replay, median, L2 flushed) of a wider grid of decode tile configs than
the tuner's, with a tile per slot (``direct_route``) and Swap-AB, at the wide models' M=1 points; each
config checked against the float32 reference first. Prints one JSON row per config.

    PYTHONPATH=$PWD python3 scripts/decode_configs.py > rows.jsonl
"""

import json
from itertools import product

from _points import checked_error, layer, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.tile import TileConfig
from moebench.timing import time_graph

POINTS = [("deepseek-v3@tp8", "fp8-block128", 1), ("qwen3-30b-a3b", "fp8-block128", 1), ("qwen3-30b-a3b", "bf16", 1)]


def sweep(model: str, dtype: str, m: int) -> None:
    problem, inp, ref, out = point_setup(model, dtype, m)
    k_steps = -(-problem.shape.hidden // 128)
    for block_n, stages, split in product((32, 64, 128), (3, 5), (1, 4, 8, 16)):
        if k_steps // split < 2:
            continue
        cfg = TileConfig(16, block_n, 128, 1, 4, stages, swap_ab=True, atomic_sum=False, split_k=split,
                         direct_route=True)
        fn = layer(kernels, inp, cfg, out)
        err = checked_error(fn, out, ref)
        us = round(time_graph(fn, budget_s=0.2).median_us, 1) if err < problem.spec.rtol else None
        print(json.dumps(dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), err=round(err, 5), us=us)),
              flush=True)


for point in POINTS:
    sweep(*point)
