"""A/B on a GPU: at fp8-block128, x's quantization launch zeroing GEMM2's atomic sums where they are too large
for GEMM1's programs to zero (the working tree) against a launch of their own zeroing them (the kernels of
commit e19ae5a), at each fp8-block128 point whose best config (``_points.REPORT_RUNS``) has such sums, and
Qwen3 fp8-block128 M=256, whose 1 MiB sums GEMM1 zeroes in both (a control: the same launches in both).

Variants "base" (e19ae5a) and "new" (the tree), each checked against the float32 reference first (``*_err``),
timed three times (``ROUNDS`` in the environment: that many), interleaved, every other round in reverse order
(CUDA-graph replay, L2 flushed, median us), the fastest kept. Then the GPU time per kernel of the tree's layer
at each point (PyTorch profiler, ``moebench.profile``), to say what the launches around the GEMMs still take.

    git show e19ae5a:moebench/kernels/fused_moe.py > .scratch/fused_moe_head.py
    PYTHONPATH=$PWD python3 scripts/ab_zero_in_xquant.py > rows.jsonl
"""

import json
import os

from _points import REPORT_RUNS, best_rows, check_then_time, prefill_first, scratch_module

import moebench.kernels.fused_moe as kernels
from moebench.profile import kernel_breakdown

head = scratch_module("fused_moe_head")
best = {key: row for key, row in best_rows(*REPORT_RUNS).items() if key[1] == "fp8-block128" and key[2] >= 256}
for cfg, problem, inp, ref, out, row in prefill_first(best):
    sum_bytes = problem.M * problem.shape.hidden * out.element_size()
    if not cfg.atomic_sum or cfg.gemm1_quant_x or sum_bytes <= kernels.ZERO_IN_GEMM1_BYTES:
        if row["point"] != "qwen3-30b-a3b fp8-block128 M=256":
            continue
    row = check_then_time(row, {"base": (head, cfg), "new": (kernels, cfg)}, inp, out, ref, problem.spec.rtol,
                          rounds=int(os.environ.get("ROUNDS", 3)), alternate=True)
    row["kernels_us"] = {r["kernel"][:40]: round(r["us"], 2) for r in kernel_breakdown(problem, "triton", cfg)}
    print(json.dumps(row), flush=True)
