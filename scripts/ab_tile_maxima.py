"""A/B on a GPU: fp8-tensor's dynamic scale of h from GEMM1's tile maxima, with no launch reading h for it.

Before, h's per-tensor quantization took two launches: one read h for its row maxima, one quantized it at their
largest. Now each GEMM1 program (without split-K) writes the maximum of the tile of h it stores, and the
quantization launch takes the largest of those. Each fp8-tensor benchmark point runs at its best config
(``_points.REPORT_RUNS``) with the kernels of ``.scratch/fused_moe_head.py`` (``git show
HEAD:moebench/kernels/fused_moe.py`` at the commit before the change, "head"), the working tree's ("maxima"), and
the old kernels once more ("head_again": how far two timings of one kernel land apart). Each variant checked
against the float32 reference first (``*_err``), then timed four times interleaved, every other round in reverse
order (CUDA-graph replay, L2 flushed, median us), the fastest kept.

    PYTHONPATH=$PWD python3 scripts/ab_tile_maxima.py [MIN_M [MAX_M]] > rows.jsonl
"""

import json
import sys

from _points import REPORT_RUNS, best_rows, check_then_time, m_range, prefill_first, scratch_module

import moebench.kernels.fused_moe as kernels

lo, hi = m_range(sys.argv[1:])
head = scratch_module("fused_moe_head")
best = {key: row for key, row in best_rows(*REPORT_RUNS).items() if key[1] == "fp8-tensor"}
for cfg, problem, inp, ref, out, row in prefill_first(best, lo, hi):
    variants = {"head": (head, cfg), "maxima": (kernels, cfg), "head_again": (head, cfg)}
    row = check_then_time(row, variants, inp, out, ref, problem.spec.rtol, rounds=4, alternate=True)
    row["gain"] = round(row["head"] / row["maxima"], 3) if "maxima" in row and "head" in row else None
    print(json.dumps(row), flush=True)
