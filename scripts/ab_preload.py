"""A/B on a GPU: GEMM2 reading its first two K steps' weights before it waits for the launch before it
(``gemm2_preload``), at decode with a tile per slot.

Each benchmark point whose best config (``_points.REPORT_RUNS``) has a tile per slot runs at that config
("off") and with ``gemm2_preload`` ("preload"); where that config walks several GEMM2 column tiles, which
the preload does not, also at one tile ("one_tile") and one tile with the preload ("one_tile_preload").
Each variant checked against the float32 reference first (``*_err``), timed twice interleaved (CUDA-graph
replay, L2 flushed by the timer's read, median us), the faster kept.

    PYTHONPATH=$PWD python3 scripts/ab_preload.py > rows.jsonl
"""

import json
from dataclasses import replace

from _points import REPORT_RUNS, best_rows, check_then_time, prefill_first

import moebench.kernels.fused_moe as kernels

best = {key: row for key, row in best_rows(*REPORT_RUNS).items() if row["config"].get("direct_route")}
for cfg, problem, inp, ref, out, row in prefill_first(best):
    if cfg.gemm2_n_tiles == 1:
        variants = {"off": cfg, "preload": replace(cfg, gemm2_preload=True)}
    else:
        one = replace(cfg, gemm2_n_tiles=1)
        variants = {"off": cfg, "one_tile": one, "one_tile_preload": replace(one, gemm2_preload=True)}
    row = check_then_time(row, {label: (kernels, c) for label, c in variants.items()}, inp, out, ref,
                          problem.spec.rtol)
    row["gain"] = {label: round(row["off"] / row[label], 3) for label in variants if label in row and "off" in row}
    print(json.dumps(row), flush=True)
