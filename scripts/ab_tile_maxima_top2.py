"""A/B on a GPU: ``ab_tile_maxima.py`` at the two fastest configs of Mixtral fp8-tensor M = 1024 and 4096 in the
tuned run of 7f72fbb (``results/h200-kernels-7f72fbb``), one with the stored top-k sum and one adding into the
output. The old kernels (``.scratch/fused_moe_head.py``, ``git show 5ef67f4:moebench/kernels/fused_moe.py``),
the new, the old again; checked against the float32 reference, then timed four times interleaved, every other
round reversed (CUDA-graph replay, L2 flushed, median us), the fastest kept.

    PYTHONPATH=$PWD python3 scripts/ab_tile_maxima_top2.py > rows.jsonl
"""

import json

from _points import check_then_time, point_setup, scratch_module

import moebench.kernels.fused_moe as kernels
from moebench.results import load_run
from moebench.tile import TileConfig

head = scratch_module("fused_moe_head")
_, df = load_run("results/h200-kernels-7f72fbb/mixtral-fp8-tensor")
for m in (1024, 4096):
    problem, inp, ref, out = point_setup("mixtral-8x7b", "fp8-tensor", m)
    for r in df[(df["M"] == m) & (df["correct"] == True)].nsmallest(2, "time_us").to_dict("records"):  # noqa: E712
        cfg = TileConfig.from_dict(r["config"])
        row = dict(point=f"mixtral-8x7b fp8-tensor M={m}", config=cfg.as_dict(), bench_us=round(r["time_us"], 1))
        variants = {"head": (head, cfg), "maxima": (kernels, cfg), "head_again": (head, cfg)}
        print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol, rounds=4, alternate=True)),
              flush=True)
