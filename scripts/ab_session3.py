"""A/B on a GPU, layer time (graph replay, median, L2 flushed) at each point's best config of
results/h200-kernels-bab17e1, each variant checked against the float32 reference first:

- "base": the kernel file before these changes (``.scratch/fused_moe_base.py``, commit cbf6f9f);
- "new": the working tree's kernels, same config (slot ids, expert and used length loaded together;
  relaxed atomics; one zero fill; the top-k sum in one Triton launch);
- decode fp8-block128 points: "qg" = the same config with ``quant_in_gemm`` (a tile-config field, present
  in the working tree for this run only: each GEMM quantized its own activation tiles, no quantization
  launches; dropped, as it was slower), and "qg_sN" with N stages; that branch is removed below;
- prefill points: "sN" = the same config with N stages (occupancy against stages);
- "sum_torch" / "sum_triton": the stored top-k sum alone at DeepSeek-V3@tp8 M=4096 ([32768, 7168] bf16).

    git show cbf6f9f:moebench/kernels/fused_moe.py > .scratch/fused_moe_base.py
    PYTHONPATH=$PWD python3 scripts/ab_session3.py > rows.jsonl
"""

import json
from dataclasses import replace

import torch
import triton
from _points import best_rows, checked_error, layer, point_setup, scratch_module

import moebench.kernels.fused_moe as new
from moebench.tile import TileConfig
from moebench.timing import time_graph

base = scratch_module("fused_moe_base")

DS, QWEN = "deepseek-v3@tp8", "qwen3-30b-a3b"
DECODE = [(DS, "fp8-block128", 1), (DS, "fp8-block128", 4), (DS, "fp8-block128", 16),
          (QWEN, "fp8-block128", 1), (QWEN, "fp8-block128", 4), (QWEN, "fp8-block128", 16), (QWEN, "bf16", 1)]
PREFILL = [(DS, "fp8-block128", 4096), (DS, "fp8-block128", 1024), (QWEN, "fp8-block128", 4096),
           (QWEN, "fp8-block128", 1024), (QWEN, "bf16", 4096), ("mixtral-8x7b", "fp8-tensor", 1024)]

best = best_rows()


def measure(model: str, dtype: str, m: int) -> dict:
    problem, inp, ref, out = point_setup(model, dtype, m)
    cfg = TileConfig.from_dict(best[(model, dtype, m)]["config"])
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=best[(model, dtype, m)]["time_us"])

    def timed(label, mod, c):
        fn = layer(mod, inp, c, out)
        err = checked_error(fn, out, ref)
        row[f"{label}_err"] = round(err, 5)
        row[label] = round(time_graph(fn, budget_s=0.3).median_us, 1) if err < problem.spec.rtol else None

    timed("base", base, cfg)
    timed("new", new, cfg)
    if m >= 1024:
        for stages in (2, 3, 4):
            if stages != cfg.num_stages:
                timed(f"s{stages}", new, replace(cfg, num_stages=stages))
    return row


def topk_sum_alone() -> dict:
    M, topk, H = 4096, 8, 7168
    rows = torch.randn(M * topk, H, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M, H, device="cuda", dtype=torch.bfloat16)
    torch.sum(rows.view(M, topk, H), dim=1, out=out)
    ref = out.clone()
    out.fill_(float("nan"))

    def triton_sum():
        new._topk_sum[(M, triton.cdiv(H, new.TOPK_SUM_BLOCK))](rows, out, H, rows.stride(0), out.stride(0),
                                                              TOPK=topk, BLOCK_N=new.TOPK_SUM_BLOCK)
    triton_sum()
    return dict(point="stored top-k sum alone, [32768, 7168] bf16 -> [4096, 7168]",
                max_abs_diff=(out.float() - ref.float()).abs().max().item(),
                sum_torch=round(time_graph(lambda: torch.sum(rows.view(M, topk, H), dim=1, out=out)).median_us, 1),
                sum_triton=round(time_graph(triton_sum).median_us, 1))


print(json.dumps(topk_sum_alone()), flush=True)
for point in DECODE + PREFILL:
    print(json.dumps(measure(*point)), flush=True)
