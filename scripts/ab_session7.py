"""A/B on a GPU: the align step sorting each segment of slots (a program per segment) against the align
of commit 7ae64fc (a program per expert and segment), and GEMM1's split-K partials stored per split
(summed by the activation launch) against partials added with atomics into a zeroed buffer.

Part 1, the align alone (graph replay, median, L2 flushed) at decode to prefill slot counts, the new align
checked against ``moe_align_reference`` first, at segments of 256, 512 and 1024 slots, also with
Triton's ``tl.sort`` in place of ``_bitonic_sort``.
Part 2, the layer at each point's best config of results/h200-kernels-3560e62 and -072bd27 that uses the
align or split-K (not Mixtral): "base" (7ae64fc's kernels and align), "align" (7ae64fc's kernels, the new align),
"new" (the working tree); each checked against the float32 reference first, timed twice interleaved,
keeping the faster median.

    git show 7ae64fc:moebench/kernels/fused_moe.py > .scratch/fused_moe_7ae.py
    git show 7ae64fc:moebench/routing.py > .scratch/routing_old.py
    PYTHONPATH=$PWD python3 scripts/ab_session7.py > rows.jsonl
"""

import json

import torch
from _points import best_rows, check_then_time, point_setup, scratch_module

import moebench.kernels.fused_moe as new
import moebench.routing as routing
from moebench.tile import TileConfig
from moebench.timing import time_graph

old_routing = scratch_module("routing_old")
base = scratch_module("fused_moe_7ae")
base.moe_align = old_routing.moe_align
with_new_align = scratch_module("fused_moe_7ae")  # a second copy, bound to the working tree's align
with_new_align.moe_align = routing.moe_align

# The same align with Triton's own tl.sort in place of _bitonic_sort (too slow for the interpreter's tests).
with open("moebench/routing.py") as f:
    text = f.read().replace("_bitonic_sort(experts * SEGMENT + (slots - g * SEGMENT), SEGMENT, LOG_SEGMENT)",
                            "tl.sort(experts * SEGMENT + (slots - g * SEGMENT))")
    assert "tl.sort(" in text
with open(".scratch/routing_tlsort.py", "w") as f:
    f.write(text)
tlsort = scratch_module("routing_tlsort")

segment = routing.ALIGN_SEGMENT
for T, E, block_m in [(128, 256, 16), (512, 256, 16), (2048, 256, 16), (8192, 256, 64), (32768, 256, 64),
                      (2048, 128, 16), (8192, 128, 64), (32768, 128, 64), (32768, 128, 128), (8192, 8, 128)]:
    ids = torch.randint(0, E, (T // 8, 8) if E > 8 else (T // 2, 2), dtype=torch.int32, device="cuda")
    ref = routing.moe_align_reference(ids, E, block_m)
    n = int(ref.num_padded.item())
    row = dict(T=T, E=E, block_m=block_m)
    row["old"] = round(time_graph(lambda: old_routing.moe_align(ids, E, block_m), budget_s=0.2).median_us, 1)
    for module, label in ((routing, "seg"), (tlsort, "tlsort")):
        for seg in (256, 512, 1024):
            module.ALIGN_SEGMENT = seg
            got = module.moe_align(ids, E, block_m)
            same = (torch.equal(got.num_padded, ref.num_padded) and torch.equal(got.sorted_ids[:n], ref.sorted_ids[:n])
                    and torch.equal(got.expert_ids[: n // block_m], ref.expert_ids[: n // block_m]))
            t = time_graph(lambda: module.moe_align(ids, E, block_m), budget_s=0.2).median_us
            row[f"{label}{seg}"] = round(t, 1) if same else "WRONG"
        module.ALIGN_SEGMENT = segment
    print(json.dumps(row), flush=True)

best = best_rows("results/h200-kernels-3560e62", "results/h200-kernels-072bd27/*-*")
for (model, dtype, m), row in sorted(best.items()):
    cfg = TileConfig.from_dict(row["config"])
    if (cfg.direct_route and cfg.split_k == 1) or model == "mixtral-8x7b":
        continue  # no align and no split-K; Mixtral (E = 8) has a 3.6 us align
    problem, inp, ref, out = point_setup(model, dtype, m)
    result = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=row["time_us"])
    variants = {"base": (base, cfg), "align": (with_new_align, cfg), "new": (new, cfg)}
    for _ in range(2 if cfg.split_k > 1 else 1):  # split-K decode points differ by about 1 us: twice
        print(json.dumps(check_then_time(dict(result), variants, inp, out, ref, problem.spec.rtol)), flush=True)
