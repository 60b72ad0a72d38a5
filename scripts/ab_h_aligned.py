"""A/B on a GPU, on the tree of commit e07a214 (its kernels were reverted in 936b06f): h written and read in
the align's order (a row per place of sorted_ids, so GEMM2 reads each tile's rows contiguous; the working tree)
against h by slot (GEMM2 gathers its rows through sorted_ids; the kernels of f04fbcf, copied to
.scratch/fused_moe_head.py), every benchmark point of M in [MIN_M, MAX_M] at its best config of the runs the
report of docs/kernels.md reads (``_points.REPORT_RUNS``). Points whose config has split-K GEMM1 or a tile per
slot, and fp8-tensor's (h's dynamic per-tensor scale), run the same kernels either way (not timed).

Variants "base" (the copy) and "new" (the tree), each checked against the float32 reference first (``*_err``),
timed three rounds interleaved, every other round in reverse order (CUDA-graph replay, L2 flushed, median us),
the fastest kept.

    git checkout e07a214 && git show f04fbcf:moebench/kernels/fused_moe.py > .scratch/fused_moe_head.py
    PYTHONPATH=$PWD python3 scripts/ab_h_aligned.py [MIN_M [MAX_M]] > rows.jsonl
"""

import json
import sys

from _points import REPORT_RUNS, best_rows, check_then_time, m_range, prefill_first, scratch_module

import moebench.kernels.fused_moe as kernels

head = scratch_module("fused_moe_head")
for cfg, problem, inp, ref, out, row in prefill_first(best_rows(*REPORT_RUNS), *m_range(sys.argv[1:])):
    if cfg.direct_route or cfg.split_k > 1 or problem.dtype.startswith("fp8-tensor"):
        continue
    variants = {"base": (head, cfg), "new": (kernels, cfg)}
    row = check_then_time(row, variants, inp, out, ref, problem.spec.rtol, rounds=3, alternate=True)
    if "base" in row and "new" in row:
        row["new_over_base"] = round(row["new"] / row["base"], 3)
    print(json.dumps(row), flush=True)
