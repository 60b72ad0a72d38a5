"""A/B on a GPU: who asks L2 for GEMM2's weights at decode with a tile per slot (``gemm2_prefetch``).

Each benchmark point whose best config (``_points.REPORT_RUNS``) has a tile per slot runs at that config
("off") and with GEMM2's weights asked of L2 by bulk prefetches (``cp.async.bulk.prefetch.L2``):
"gemm2_early", by GEMM2's programs before they wait for the launch before them (they start while it ends);
"gemm1_end", by GEMM1's programs after their K loop, each a share of its slot's expert; "gemm1_start", by
GEMM1's programs before their K loop. Each variant checked against the float32 reference first (``*_err``),
timed twice interleaved (CUDA-graph replay, L2 flushed by the timer's read, median us), the faster kept.

    PYTHONPATH=$PWD python3 scripts/ab_prefetch.py > rows.jsonl

It ran (results/h200-session15/ab-prefetch.jsonl) on the tree of commit a523f92, which had the tile-config field
``gemm2_prefetch``; every form lost at 6 of the 8 points, so the next commit removed the field and this
script no longer runs as it is.
"""

import json
from dataclasses import replace

from _points import REPORT_RUNS, best_rows, check_then_time, prefill_first

import moebench.kernels.fused_moe as kernels

VARIANTS = {"off": 0, "gemm2_early": 1, "gemm1_end": 2, "gemm1_start": 3}

best = {key: row for key, row in best_rows(*REPORT_RUNS).items() if row["config"].get("direct_route")}
for cfg, problem, inp, ref, out, row in prefill_first(best):
    variants = {label: (kernels, replace(cfg, gemm2_prefetch=v)) for label, v in VARIANTS.items()}
    row = check_then_time(row, variants, inp, out, ref, problem.spec.rtol)
    row["gain"] = {label: round(row["off"] / row[label], 3) for label in VARIANTS if label in row and "off" in row}
    print(json.dumps(row), flush=True)
