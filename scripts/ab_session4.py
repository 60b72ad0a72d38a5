"""A/B on a GPU, layer time (graph replay, median, L2 flushed) at each point's best config of
results/h200-kernels-30170aa, each variant checked against the float32 reference first:

- "base": the kernel file before these changes (``.scratch/fused_moe_base.py``, commit 1c36de1);
- "new": the working tree's kernels, same config (fp8-block128 with split-K: h quantized by the launch
  that applies the activation, not by a launch of its own);
- "direct": "new" with ``direct_route`` (a tile per slot, no align step), where M * topk <= E;
- "n128" / "n128_direct": fp8-block128 points whose best BLOCK_N is not 128, at BLOCK_N 128.

Each variant is timed twice, interleaved with the others, and keeps the faster median.

    git show 1c36de1:moebench/kernels/fused_moe.py > .scratch/fused_moe_base.py
    PYTHONPATH=$PWD python3 scripts/ab_session4.py > rows.jsonl
"""

import json
from dataclasses import replace

from _points import best_rows, check_then_time, point_setup, scratch_module

import moebench.kernels.fused_moe as new
from moebench.tile import TileConfig

base = scratch_module("fused_moe_base")

DS, QWEN, MIX = "deepseek-v3@tp8", "qwen3-30b-a3b", "mixtral-8x7b"
POINTS = [(DS, "fp8-block128", m) for m in (1, 4, 16)]
POINTS += [(QWEN, d, m) for d in ("fp8-block128", "bf16") for m in (1, 4, 16)]
POINTS += [(MIX, d, m) for d in ("bf16", "fp8-tensor") for m in (1, 4)]

best = best_rows("results/h200-kernels-30170aa/*")


def measure(model: str, dtype: str, m: int) -> dict:
    problem, inp, ref, out = point_setup(model, dtype, m)
    shape = problem.shape
    cfg = TileConfig.from_dict(best[(model, dtype, m)]["config"])
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=best[(model, dtype, m)]["time_us"])

    variants = {"base": (base, cfg), "new": (new, cfg)}
    direct = m * shape.topk <= shape.experts
    if direct:
        variants["direct"] = (new, replace(cfg, direct_route=True))
    if dtype == "fp8-block128" and cfg.BLOCK_SIZE_N != 128:
        n128 = replace(cfg, BLOCK_SIZE_N=128, num_stages=min(cfg.num_stages, 3))
        variants["n128"] = (new, n128)
        if direct:
            variants["n128_direct"] = (new, replace(n128, direct_route=True))
    return check_then_time(row, variants, inp, out, ref, problem.spec.rtol)


for point in POINTS:
    print(json.dumps(measure(*point)), flush=True)
