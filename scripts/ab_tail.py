"""A/B on a GPU: an expert's last row tile at half or a quarter of BLOCK_M rows (``tail_tiles``), at prefill.

Each benchmark point of M >= 256 whose best config (``_points.REPORT_RUNS``) tiles the align step's slots in
tiles of 32 rows or more runs at that config ("off"), with ``tail_tiles`` 1 ("tail1") and, from 64 rows, 2
("tail2"); and at twice its BLOCK_M with ``tail_tiles`` 2 ("double_tail2", up to 128 rows, stages lowered to
fit), as the tails make taller tiles pad less. Each variant checked against the float32 reference first
(``*_err``), timed twice interleaved (CUDA-graph replay, L2 flushed, median us), the faster kept; a variant
that does not compile is named in ``failed``.

    PYTHONPATH=$PWD python3 scripts/ab_tail.py [MIN_M [MAX_M]] > rows.jsonl
"""

import json
import sys
from dataclasses import replace

from _points import REPORT_RUNS, best_rows, check_then_time, m_range, prefill_first

import moebench.kernels.fused_moe as kernels
from moebench.tile import fit_stages

lo, hi = m_range(sys.argv[1:])
best = {key: row for key, row in best_rows(*REPORT_RUNS).items()
        if not row["config"].get("direct_route") and row["config"]["BLOCK_SIZE_M"] >= 32}
for cfg, problem, inp, ref, out, row in prefill_first(best, max(lo, 256), hi):
    bm = cfg.BLOCK_SIZE_M
    variants = {"off": cfg, "tail1": replace(cfg, tail_tiles=1)}
    if bm >= 64:
        variants["tail2"] = replace(cfg, tail_tiles=2)
    if bm <= 64:
        variants["double_tail2"] = fit_stages(replace(cfg, BLOCK_SIZE_M=2 * bm, tail_tiles=2),
                                              inp.weights.w13.element_size())
    row["failed"] = []
    row = check_then_time(row, {label: (kernels, c) for label, c in variants.items()}, inp, out, ref,
                          problem.spec.rtol)
    row["gain"] = {label: round(row["off"] / row[label], 3) for label in variants if label in row and "off" in row}
    print(json.dumps(row), flush=True)
