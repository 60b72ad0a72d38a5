"""Registers per thread at the fp8-block128 prefill points on a GPU: the best 64x64 tile at 3 stages (72 KB of
shared memory, room for three programs per SM) compiled with at most 168 registers per thread (three 4-warp
programs fit the register file) against the compiler's choice, and at 4 stages (two programs per SM). Each
variant checked against the float32 reference, then timed (CUDA-graph replay, L2 flushed, median us), twice
interleaved; the registers and spills of each compiled GEMM are printed.

    PYTHONPATH=$PWD python3 scripts/block128_maxnreg.py > rows.jsonl

It runs on the tree of commit 724c970, whose kernels take a register cap (``MAXNREG``); the next commit
removed it.
"""

import json

from _points import checked_error, layer, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.tile import TileConfig
from moebench.timing import time_graph

POINTS = [("qwen3-30b-a3b", 1024), ("qwen3-30b-a3b", 4096), ("deepseek-v3@tp8", 1024), ("deepseek-v3@tp8", 4096)]
VARIANTS = {"s4": (4, None), "s3": (3, None), "s3_r168": (3, 168), "s3_r128": (3, 128)}

for model, m in POINTS:
    problem, inp, ref, out = point_setup(model, "fp8-block128", m)
    walk = 8 if model.startswith("deepseek") else 1
    row = dict(point=f"{model} fp8-block128 M={m}")
    fns = {}
    for label, (stages, regs) in VARIANTS.items():
        cfg = TileConfig(64, 64, 128, 8, 4, stages, atomic_sum=False, gemm2_block_n=128, gemm2_n_tiles=walk)
        kernels.MAXNREG = regs
        compiled: list = []
        w = inp.weights
        kernels.fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, cfg, out=out, fp8_scheme=w.fp8_scheme,
                          w13_scale=w.w13_scale, w2_scale=w.w2_scale, compiled=compiled)
        row[f"{label}_regs"] = [getattr(k, "n_regs", None) for k in compiled]
        row[f"{label}_spills"] = [getattr(k, "n_spills", None) for k in compiled]
        fn = layer(kernels, inp, cfg, out)
        row[f"{label}_err"] = round(checked_error(fn, out, ref), 5)
        fns[label] = (fn, regs)
    for _ in range(2):
        for label, (fn, regs) in fns.items():
            kernels.MAXNREG = regs  # the launch picks the variant compiled for this option
            t = round(time_graph(fn, budget_s=0.3).median_us, 1)
            row[label] = min(t, row.get(label, t))
    kernels.MAXNREG = None
    print(json.dumps(row), flush=True)
