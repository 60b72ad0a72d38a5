"""A/B on a GPU at decode: layer time (graph replay) with the one-program align ("one", then used up
to 128 slots at any expert count) against the two-launch align ("two"), same tile config; commit
5d39ccd, ``PYTHONPATH=$PWD python3 scripts/ab_align.py``. Output: results/h200-align-ab/rows.jsonl.
"""
import functools
import json

import torch

import moebench.kernels.fused_moe as fm
import moebench.routing as routing
from moebench.models import get_model, shard
from moebench.problem import Problem, make_inputs
from moebench.tile import TileConfig
from moebench.timing import time_graph

orig = routing.moe_align
POINTS = [
    ("deepseek-v3", 8, "fp8-block128", 1, dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=4, num_stages=3, swap_ab=True, split_k=16)),
    ("qwen3-30b-a3b", 1, "bf16", 1, dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=4, num_stages=4, swap_ab=True)),
    ("qwen3-30b-a3b", 1, "fp8-block128", 1, dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=4, num_stages=3, swap_ab=True)),
    ("mixtral-8x7b", 1, "fp8-tensor", 1, dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=256, num_warps=4, num_stages=3, swap_ab=True)),
]
for name, tp, dtype, m, c in POINTS:
    s = get_model(name)
    s = shard(s, tp=tp) if tp > 1 else s
    p = Problem(s, m, dtype)
    inp = make_inputs(p, "cuda")
    w = inp.weights
    out = torch.empty(m, s.hidden, device="cuda", dtype=torch.bfloat16)
    for atomic in (True, False):
        cfg = TileConfig(**{**c, "atomic_sum": atomic})
        res = {}
        for one in (False, None):
            fm.moe_align = functools.partial(orig, one_program=one)
            t = time_graph(lambda: fm.fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, cfg, out=out,
                           fp8_scheme=w.fp8_scheme, w13_scale=w.w13_scale, w2_scale=w.w2_scale), budget_s=0.3)
            res["two" if one is False else "one"] = round(t.median_us, 1)
        print(json.dumps(dict(point=f"{name}@{tp} {dtype} M={m}", atomic=atomic, **res)), flush=True)
fm.moe_align = orig
