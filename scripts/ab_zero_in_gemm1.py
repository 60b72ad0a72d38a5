"""A/B on a GPU: GEMM1's programs zeroing GEMM2's atomic sums (the working tree) against a launch zeroing them
first (the kernels of commit 3869705), every benchmark point at its best config of the runs the report of
docs/kernels.md reads (``_points.REPORT_RUNS``, whose last were those of 3869705 when the committed rows
were made), and with the sum into the output where that config stores rows.

Variants: "base" (3869705, the best config), "new" (the tree, the best config; where it has the atomic sum),
"out_base" / "out_new" (the best config with the sum into the output; where it stores rows). Each variant
checked against the float32 reference first (``*_err``), timed twice interleaved (CUDA-graph replay, L2
flushed, median us), the faster kept.

    git show 3869705:moebench/kernels/fused_moe.py > .scratch/fused_moe_head.py
    PYTHONPATH=$PWD python3 scripts/ab_zero_in_gemm1.py [MIN_M [MAX_M]] > rows.jsonl
"""

import json
import sys
from dataclasses import replace

from _points import REPORT_RUNS, best_rows, check_then_time, m_range, prefill_first, scratch_module

import moebench.kernels.fused_moe as kernels

head = scratch_module("fused_moe_head")
best = best_rows(*REPORT_RUNS)
for cfg, problem, inp, ref, out, row in prefill_first(best, *m_range(sys.argv[1:])):
    variants = {"base": (head, cfg)}
    if cfg.atomic_sum:
        variants["new"] = (kernels, cfg)
    else:
        into_out = replace(cfg, atomic_sum=True, atomic_out=True)
        variants.update(out_base=(head, into_out), out_new=(kernels, into_out))
    print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol)), flush=True)
