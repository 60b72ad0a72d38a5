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

import json

import triton
from _points import best_rows, checked_error, layer, point_setup, scratch_module

import moebench.kernels.fused_moe as new
from moebench.tile import TileConfig
from moebench.timing import time_graph

base = scratch_module("fused_moe_base")

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
    _, inp, ref, out = point_setup(model, dtype, m)
    cfg = TileConfig.from_dict(best[(model, dtype, m)]["config"])
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=best[(model, dtype, m)]["time_us"])

    def timed(label, fn):
        err = checked_error(fn, out, ref)
        row[f"{label}_err"] = round(err, 5)
        row[label] = round(time_graph(fn, budget_s=0.3).median_us, 1) if err < 0.05 else None

    flipped = TileConfig.from_dict({**cfg.as_dict(), "atomic_sum": not cfg.atomic_sum})
    timed("base", layer(base, inp, cfg, out))
    timed("new", layer(new, inp, cfg, out))
    timed("new_flip", layer(new, inp, flipped, out))
    if prefill:
        kernel = new._gemm2_combine
        for bn, warps, stages in GEMM2:
            new._gemm2_combine = Gemm2Override(kernel, bn, warps, stages)
            try:
                timed(f"g2_{bn}_w{warps}_s{stages}", layer(new, inp, cfg, out))
            finally:
                new._gemm2_combine = kernel
    return row


for point in DECODE:
    print(json.dumps(measure(*point, prefill=False)), flush=True)
for point in PREFILL:
    print(json.dumps(measure(*point, prefill=True)), flush=True)
