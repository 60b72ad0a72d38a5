"""How much of a prefill point's time its padded rows cost, measured as an upper bound on a GPU.

The align step pads each expert's slots to a multiple of BLOCK_M, and a padded row costs its tile's MMA
work (and weight reads) like a real one. Each benchmark point of M >= 256 runs at its best config
(``_points.REPORT_RUNS``) twice: with the benchmark's routing ("seed") and with a balanced routing of the
same shape ("balanced": token t's top-k experts are ``(t * topk + j) % E`` for a shuffled t, so every expert
gets exactly ``M * topk / E`` slots, at most of these points a multiple of BLOCK_M: no padded row). Same weights,
same activations, same floor. Each variant is checked against its own float32 reference, then timed (seed,
balanced, seed; twice each: CUDA-graph replay, L2 flushed, median us), the faster kept. ``pad`` is the padded
rows over the real ones of each routing at the config's BLOCK_M.

    PYTHONPATH=$PWD python3 scripts/padding_bound.py [MIN_M [MAX_M]] > rows.jsonl
"""

import json
import math
import sys
from dataclasses import replace

import torch
from _points import REPORT_RUNS, best_rows, check_then_time, m_range, prefill_first

import moebench.kernels.fused_moe as kernels
from moebench.paths.torch_ref import moe_reference


def balanced_ids(M: int, E: int, topk: int, device) -> torch.Tensor:
    """[M, topk] int32: token t's experts are (p(t) * topk + j) % E for a fixed shuffle p."""
    p = torch.randperm(M, generator=torch.Generator().manual_seed(0))
    ids = (p[:, None] * topk + torch.arange(topk)[None, :]) % E
    return ids.to(torch.int32).to(device)


def padded_over_real(ids: torch.Tensor, E: int, block_m: int) -> float:
    counts = torch.bincount(ids.flatten().long(), minlength=E).tolist()
    return sum(math.ceil(c / block_m) * block_m for c in counts) / sum(counts)


lo, hi = m_range(sys.argv[1:])
best = {k: r for k, r in best_rows(*REPORT_RUNS).items() if not r["config"].get("direct_route")}
for cfg, problem, inp, ref, out, row in prefill_first(best, max(lo, 256), hi):
    E, topk = problem.shape.experts, problem.shape.topk
    bal = replace(inp, topk_ids=balanced_ids(problem.M, E, topk, inp.x.device))
    bal_ref = moe_reference(bal.x, bal.weights, bal.topk_weights, bal.topk_ids).float()
    row["pad"] = {"seed": round(padded_over_real(inp.topk_ids, E, cfg.BLOCK_SIZE_M), 3),
                  "balanced": round(padded_over_real(bal.topk_ids, E, cfg.BLOCK_SIZE_M), 3)}
    row = check_then_time(row, {"seed": (kernels, cfg)}, inp, out, ref, problem.spec.rtol)
    row = check_then_time(row, {"balanced": (kernels, cfg)}, bal, out, bal_ref, problem.spec.rtol)
    row = check_then_time(row, {"seed": (kernels, cfg)}, inp, out, ref, problem.spec.rtol)  # the faster kept
    if "seed" in row and "balanced" in row:
        row["gain"] = round(row["seed"] / row["balanced"], 3)
    print(json.dumps(row), flush=True)
