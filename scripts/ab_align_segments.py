"""A/B on a GPU at the prefill points: layer time (graph replay, median) with the two-launch align over
segments of ALIGN_SEGMENT slots ("segmented") against one segment per expert ("whole", the align before
segments), each point at its best config of results/h200-kernels-bab17e1; and the align step alone.

    PYTHONPATH=$PWD python3 scripts/ab_align_segments.py > rows.jsonl
"""

import json

import torch
from _points import best_rows, problem_of

import moebench.routing as routing
from moebench.kernels.fused_moe import fused_moe
from moebench.problem import make_inputs
from moebench.tile import TileConfig
from moebench.timing import time_graph

POINTS = [("qwen3-30b-a3b", "bf16", 4096), ("qwen3-30b-a3b", "fp8-block128", 1024),
          ("qwen3-30b-a3b", "fp8-block128", 4096), ("deepseek-v3@tp8", "fp8-block128", 1024),
          ("deepseek-v3@tp8", "fp8-block128", 4096), ("mixtral-8x7b", "bf16", 4096)]

best = best_rows()


def measure(model: str, dtype: str, m: int) -> dict:
    problem = problem_of(model, dtype, m)
    shape = problem.shape
    inp = make_inputs(problem, "cuda")
    w = inp.weights
    cfg = TileConfig.from_dict(best[(model, dtype, m)]["config"])
    out = torch.empty(m, shape.hidden, device="cuda", dtype=problem.spec.act)

    def layer():
        fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, cfg, out=out, fp8_scheme=w.fp8_scheme,
                  w13_scale=w.w13_scale, w2_scale=w.w2_scale)

    def align():
        routing.moe_align(inp.topk_ids, shape.experts, cfg.BLOCK_SIZE_M)

    row = dict(point=f"{model} {dtype} M={m}")
    segmented = routing.ALIGN_SEGMENT
    for label, seg in (("whole", 1 << 30), ("segmented", segmented)):
        routing.ALIGN_SEGMENT = seg
        row[f"layer_{label}_us"] = round(time_graph(layer, budget_s=0.3).median_us, 1)
        row[f"align_{label}_us"] = round(time_graph(align, budget_s=0.2).median_us, 1)
    routing.ALIGN_SEGMENT = segmented
    return row


for point in POINTS:
    print(json.dumps(measure(*point)), flush=True)
