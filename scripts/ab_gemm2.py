"""A/B on a GPU, layer time (graph replay, median, L2 flushed) at each point's best config of
results/h200-kernels-bab17e1:

- "base": the kernel file before this change (``.scratch/fused_moe_base.py``: tile coordinates that
  load the used length before the slot ids, acq_rel atomics);
- "new": the working tree's kernels (slot ids, expert and used length loaded together; relaxed
  atomics), same config; "new_flip": the other top-k sum form;
- "g2_BN_wW_sS": the new kernels with GEMM2 alone launched at BLOCK_N=BN, W warps, S stages (the
  same BLOCK_M, since the align is shared); prefill points only.

Each variant's output is checked against the float32 reference before it is timed.

    cp <old>/moebench/kernels/fused_moe.py .scratch/fused_moe_base.py
    PYTHONPATH=$PWD python3 scripts/ab_gemm2.py > rows.jsonl
"""

import importlib.util
import json

import torch
import triton
from _points import best_rows, problem_of

import moebench.kernels.fused_moe as new
from moebench.paths.torch_ref import moe_reference
from moebench.problem import make_inputs
from moebench.tile import TileConfig
from moebench.timing import time_graph

spec = importlib.util.spec_from_file_location("fm_base", ".scratch/fused_moe_base.py")
base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)

DECODE = [("deepseek-v3@tp8", "fp8-block128", 1), ("deepseek-v3@tp8", "fp8-block128", 4),
          ("qwen3-30b-a3b", "fp8-block128", 1), ("qwen3-30b-a3b", "bf16", 1)]
PREFILL = [("deepseek-v3@tp8", "fp8-block128", 4096), ("deepseek-v3@tp8", "fp8-block128", 1024),
           ("qwen3-30b-a3b", "fp8-block128", 4096), ("qwen3-30b-a3b", "fp8-block128", 1024),
           ("qwen3-30b-a3b", "bf16", 4096), ("mixtral-8x7b", "fp8-tensor", 1024)]
GEMM2 = [(64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 4, 3), (128, 8, 2), (128, 8, 3), (256, 8, 2)]

best = best_rows()


class Gemm2Override:
    """Stands in for ``_gemm2_combine``: launches it with another BLOCK_N / warps / stages."""

    def __init__(self, kernel, block_n: int, warps: int, stages: int):
        self.kernel, self.block_n, self.warps, self.stages = kernel, block_n, warps, stages

    def __getitem__(self, grid):
        def launch(*args, **kw):
            max_blocks, n = args[10], args[11]  # max_pid_m, N (hidden)
            kw.update(BLOCK_N=self.block_n, num_warps=self.warps, num_stages=self.stages)
            return self.kernel[(max_blocks * triton.cdiv(n, self.block_n),)](*args, **kw)
        return launch


def measure(model: str, dtype: str, m: int, prefill: bool) -> dict:
    problem = problem_of(model, dtype, m)
    shape = problem.shape
    inp = make_inputs(problem, "cuda")
    w = inp.weights
    ref = moe_reference(inp.x, w, inp.topk_weights, inp.topk_ids).float()
    cfg = TileConfig.from_dict(best[(model, dtype, m)]["config"])
    out = torch.empty(m, shape.hidden, device="cuda", dtype=problem.spec.act)
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=best[(model, dtype, m)]["time_us"])

    def run(mod, c):
        return lambda: mod.fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, c, out=out,
                                     fp8_scheme=w.fp8_scheme, w13_scale=w.w13_scale, w2_scale=w.w2_scale)

    def timed(label, fn):
        out.fill_(float("nan"))
        fn()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        row[f"{label}_err"] = round(err, 5)
        row[label] = round(time_graph(fn, budget_s=0.3).median_us, 1) if err < 0.05 else None

    flipped = TileConfig.from_dict({**cfg.as_dict(), "atomic_sum": not cfg.atomic_sum})
    timed("base", run(base, cfg))
    timed("new", run(new, cfg))
    timed("new_flip", run(new, flipped))
    if prefill:
        kernel = new._gemm2_combine
        for bn, warps, stages in GEMM2:
            new._gemm2_combine = Gemm2Override(kernel, bn, warps, stages)
            try:
                timed(f"g2_{bn}_w{warps}_s{stages}", run(new, cfg))
            finally:
                new._gemm2_combine = kernel
    return row


for point in DECODE:
    print(json.dumps(measure(*point, prefill=False)), flush=True)
for point in PREFILL:
    print(json.dumps(measure(*point, prefill=True)), flush=True)
