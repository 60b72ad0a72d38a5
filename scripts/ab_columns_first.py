"""A/B on a GPU: GEMM2 taking its column chunks one after another (``gemm2_columns_first``: every row tile
of a chunk before the next), so a token's top-k atomic additions come close together and its output row
stays in L2, at every benchmark point of M >= 256 at its best config of the runs the report of
docs/kernels.md reads ("base"; ``_points.REPORT_RUNS``, whose last were those of 31c76a7 when the committed
rows were made).

Variants: "out" the best config with the sum into the output (bf16 activations; fp8's output is bf16 too),
"out_nmajor" the same with GEMM2's column chunks first, "f32" the best config with the float32 atomic sum,
"f32_nmajor" that with the chunks first. Each variant checked against the float32 reference first
(``*_err``), timed twice interleaved (CUDA-graph replay, L2 flushed, median us), the faster kept.

results/h200-session12/ab-columns-first.jsonl was made before the field existed, by the tree of commit
0bd199d with GEMM2 launched at GROUP_SIZE_M = 65536 (more than any grid's row tiles: the same tile order).

    PYTHONPATH=$PWD python3 scripts/ab_columns_first.py [MIN_M [MAX_M]] > rows.jsonl
"""

import json
import sys
from dataclasses import replace

from _points import REPORT_RUNS, best_rows, check_then_time, m_range, prefill_first

import moebench.kernels.fused_moe as kernels

best = best_rows(*REPORT_RUNS)
lo, hi = m_range(sys.argv[1:] or ["256"])
for cfg, problem, inp, ref, out, row in prefill_first(best, lo, hi):
    into_out = replace(cfg, atomic_sum=True, atomic_out=True)
    f32 = replace(cfg, atomic_sum=True, atomic_out=False)
    variants = {"base": (kernels, cfg), "out": (kernels, into_out),
                "out_nmajor": (kernels, replace(into_out, gemm2_columns_first=True)),
                "f32_nmajor": (kernels, replace(f32, gemm2_columns_first=True)), "f32": (kernels, f32)}
    print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol)), flush=True)
