"""Layer time on a GPU (graph replay, median, L2 flushed) of a wider grid of decode tile configs than
the tuner's, with a tile per slot (``direct_route``) and Swap-AB, at the wide models' M=1 points; each
config checked against the float32 reference first. Prints one JSON row per config.

    PYTHONPATH=$PWD python3 scripts/decode_configs.py > rows.jsonl
"""

import json
from itertools import product

import torch
from _points import problem_of

from moebench.kernels.fused_moe import fused_moe
from moebench.paths.torch_ref import moe_reference
from moebench.problem import make_inputs
from moebench.tile import TileConfig
from moebench.timing import time_graph

POINTS = [("deepseek-v3@tp8", "fp8-block128", 1), ("qwen3-30b-a3b", "fp8-block128", 1), ("qwen3-30b-a3b", "bf16", 1)]

def sweep(model: str, dtype: str, m: int) -> None:
    problem = problem_of(model, dtype, m)
    inp = make_inputs(problem, "cuda")
    w = inp.weights
    ref = moe_reference(inp.x, w, inp.topk_weights, inp.topk_ids).float()
    out = torch.empty(m, problem.shape.hidden, device="cuda", dtype=problem.spec.act)
    k_steps = -(-problem.shape.hidden // 128)
    for block_n, stages, split in product((32, 64, 128), (3, 5), (1, 4, 8, 16)):
        if k_steps // split < 2:
            continue
        cfg = TileConfig(16, block_n, 128, 1, 4, stages, swap_ab=True, atomic_sum=False, split_k=split,
                         direct_route=True)

        def fn(cfg=cfg):
            fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, cfg, out=out,
                      fp8_scheme=w.fp8_scheme, w13_scale=w.w13_scale, w2_scale=w.w2_scale)
        out.fill_(float("nan"))
        fn()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        us = round(time_graph(fn, budget_s=0.2).median_us, 1) if err < problem.spec.rtol else None
        print(json.dumps(dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), err=round(err, 5), us=us)),
              flush=True)


for point in POINTS:
    sweep(*point)
