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

import importlib.util
import json
from dataclasses import replace

from _points import best_rows, checked_error, layer, point_setup

import moebench.kernels.fused_moe as new
from moebench.tile import TileConfig
from moebench.timing import time_graph

spec = importlib.util.spec_from_file_location("fm_base", ".scratch/fused_moe_base.py")
base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)

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

    fns = {}
    for label, (mod, c) in variants.items():
        fn = layer(mod, inp, c, out)
        err = checked_error(fn, out, ref)
        row[f"{label}_err"] = round(err, 5)
        if err < problem.spec.rtol:
            fns[label] = fn
    # Each variant twice, interleaved: a variant timed first read up to 8% slow in an earlier run.
    for _ in range(2):
        for label, fn in fns.items():
            t = round(time_graph(fn, budget_s=0.3).median_us, 1)
            row[label] = min(t, row.get(label, t))
    return row


for point in POINTS:
    print(json.dumps(measure(*point)), flush=True)
