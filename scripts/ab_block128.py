"""A/B on a GPU: fp8-block128 with the rescaled accumulator ("new", commit 2f4c6c3) against a fresh
product per step ("old": the kernel file of commit 0762f27), same configs, stored top-k sum.

    git show 0762f27:moebench/kernels/fused_moe.py > .scratch/fused_moe_old.py
    OUT=... PYTHONPATH=$PWD python3 scripts/ab_block128.py

Since commit 2f4c6c3 both forms live in one kernel (``TileConfig.block_rescale``); this is the
script as it was run for results/h200-block128-ab.
"""
import importlib.util
import json
import os

import torch

import moebench.kernels.fused_moe as new
from moebench.models import get_model, shard
from moebench.paths.torch_ref import moe_reference
from moebench.problem import Problem, make_inputs
from moebench.tile import TileConfig as T
from moebench.timing import time_graph

spec = importlib.util.spec_from_file_location("fm_old", ".scratch/fused_moe_old.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)

def shape(name):
    s = get_model(name)
    return shard(s, tp=8) if name == "deepseek-v3" else s

CFGS = [T(64, 128, 128, 8, 4, 3), T(64, 128, 128, 8, 8, 3), T(128, 128, 128, 8, 8, 3), T(128, 64, 128, 8, 4, 3),
        T(64, 64, 128, 8, 4, 4), T(128, 128, 128, 8, 8, 4), T(128, 256, 128, 8, 8, 2), T(64, 256, 128, 8, 8, 3)]
POINTS = [("qwen3-30b-a3b", 4096), ("qwen3-30b-a3b", 1024), ("deepseek-v3", 4096), ("deepseek-v3", 1024)]
rows = []
for name, m in POINTS:
    p = Problem(shape(name), m, "fp8-block128")
    inp = make_inputs(p, "cuda")
    w = inp.weights
    ref = moe_reference(inp.x, w, inp.topk_weights, inp.topk_ids)
    for cfg0 in CFGS:
        for atomic in (False,):
            cfg = T(**{**cfg0.as_dict(), "atomic_sum": atomic})
            for label, mod in (("old", old), ("new", new)):
                out = torch.full((m, p.shape.hidden), float("nan"), device="cuda", dtype=torch.bfloat16)
                ks = []
                try:
                    mod.fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, cfg, out=out, fp8_scheme="block128",
                                  w13_scale=w.w13_scale, w2_scale=w.w2_scale, compiled=ks)
                    rel = ((out.float() - ref).norm() / ref.norm()).item()
                    t = time_graph(lambda: mod.fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, cfg, out=out,
                                   fp8_scheme="block128", w13_scale=w.w13_scale, w2_scale=w.w2_scale), budget_s=0.2)
                    r = dict(model=name, M=m, cfg=f"{cfg.BLOCK_SIZE_M}x{cfg.BLOCK_SIZE_N} w{cfg.num_warps} s{cfg.num_stages}",
                             impl=label, rel=round(rel, 4), us=round(t.median_us, 1),
                             regs1=ks[0].n_regs, spill1=ks[0].n_spills, regs2=ks[1].n_regs, spill2=ks[1].n_spills)
                except Exception as e:
                    r = dict(model=name, M=m, cfg=str(cfg0), impl=label, error=str(e)[:100])
                rows.append(r)
                print(json.dumps(r), flush=True)
os.makedirs(os.environ["OUT"], exist_ok=True)
json.dump(rows, open(os.path.join(os.environ["OUT"], "ab_block128.json"), "w"))
