"""How near each point could come to its floor on this machine: a bare read of its bytes and cuBLAS's dense GEMMs
of its FLOPs, beside the layer, in one run with the floor's ceilings, on a GPU.

A point's floor is its bytes over the read rate of a 4 GiB stream, or its FLOPs over the rate of an 8192^3 GEMM.
The work of a point is neither: tens of MB read by one short launch, or GEMMs a few hundred rows tall per expert.
Per point this script times, L2 flushed, by CUDA-graph replay:
- ``layer_us``: the layer at its best config of ``_points.REPORT_RUNS``, checked against the float32 reference
  first (output poisoned), timed twice, the faster median kept;
- ``read_us``: one launch that does nothing but read the floor's bytes, contiguous (the fastest of a flat sum at
  1 to 8 programs per SM and torch's reduction): no expert's weights scattered, nothing computed;
- ``gemm_us``: cuBLAS's two dense GEMMs of the layer's shapes over all ``M * topk`` slots as contiguous rows, one
  expert's weights (``torch.mm`` in bf16; at fp8 ``torch._scaled_mm`` with per-tensor scales, which skips the
  block scales), checked against a float32 product of the same operands: no routing, no gather, no padding, no
  activation, no top-k sum.
``bound_us`` = the larger of the two: a layer that read its bytes as fast as the bare read while it computed its
GEMMs as fast as cuBLAS's dense ones, with nothing else to do, would take that. ``bound_pct`` = floor / bound.

    PYTHONPATH=$PWD python3 scripts/point_bounds.py $OUT/point-bounds.jsonl
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from _points import append_summary, checked_error, geomean, layer, measure_best_points, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.kernels.stream import read_all
from moebench.problem import Problem
from moebench.roofline import Ceilings, floor
from moebench.tile import TileConfig
from moebench.timing import time_graph
from moebench.tuning import SMS

GOAL_PCT = 85.0  # the geometric mean of pct_of_floor


def fastest(fns: dict[str, Callable[[], None]], budget_s: float = 0.05) -> tuple[str, float]:
    """(name, median us) of the fastest of ``fns``."""
    times = {name: time_graph(fn, budget_s=budget_s, min_reps=20, max_reps=100).median_us for name, fn in fns.items()}
    name = min(times, key=times.get)
    return name, times[name]


def bare_read(nbytes: int) -> tuple[str, float]:
    """The fastest one-launch read of ``nbytes`` contiguous bytes of random bf16."""
    buf = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)  # [nbytes / 2]
    total = torch.empty((), device="cuda", dtype=torch.float32)
    reads = {"torch.sum": lambda: torch.sum(buf, dim=0, dtype=torch.float32, out=total)}
    for per_sm in (1, 2, 4, 8):
        for block in (4096, 8192):
            partial = torch.empty(SMS * per_sm, device="cuda", dtype=torch.float32)  # [programs]
            reads[f"read_all p{per_sm} b{block}"] = lambda p=partial, b=block: read_all(buf, p, block=b, num_warps=8)
    return fastest(reads)


def dense_gemms(problem: Problem) -> tuple[Callable[[], None], float]:
    """cuBLAS's two dense GEMMs of the layer's shapes over ``M * topk`` contiguous rows (fp8: rounded up to 16, as
    ``_scaled_mm`` needs), and their relative error against a float32 product of the same operands."""
    s, fp8 = problem.shape, problem.dtype.startswith("fp8")
    rows = problem.M * s.topk
    rows = -(-rows // 16) * 16 if fp8 else rows
    operands = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for shape in (
        (rows, s.hidden), (2 * s.intermediate, s.hidden),  # x [T, K], w13 [2I, K]
        (rows, s.intermediate), (s.hidden, s.intermediate))]  # h [T, I], w2 [K, I]
    if fp8:
        operands = [t.to(torch.float8_e4m3fn) for t in operands]
    a1, w1, a2, w2 = operands
    h1 = torch.empty(rows, 2 * s.intermediate, device="cuda", dtype=torch.bfloat16)  # [T, 2I]
    y = torch.empty(rows, s.hidden, device="cuda", dtype=torch.bfloat16)  # [T, K]
    one = torch.ones((), device="cuda", dtype=torch.float32)

    def run() -> None:
        if fp8:  # w.t() is the column-major [K, N] operand _scaled_mm wants
            torch._scaled_mm(a1, w1.t(), one, one, out_dtype=torch.bfloat16, out=h1)
            torch._scaled_mm(a2, w2.t(), one, one, out_dtype=torch.bfloat16, out=y)
        else:
            torch.mm(a1, w1.t(), out=h1)
            torch.mm(a2, w2.t(), out=y)

    for t in (h1, y):
        t.fill_(float("nan"))
    run()
    errs = []
    for got, a, w in ((h1, a1, w1), (y, a2, w2)):
        want = a.float() @ w.float().t()
        errs.append(((got.float() - want).norm() / want.norm()).item())
    return run, max(errs)


def measure(model: str, dtype: str, m: int, cfg: TileConfig, ceilings: Ceilings) -> dict:
    """One point's row: the layer checked and timed, its two bounds, all against this run's floor."""
    problem, inp, ref, out = point_setup(model, dtype, m)
    whole = layer(kernels, inp, cfg, out)
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), rtol=problem.spec.rtol,
               layer_err=round(checked_error(whole, out, ref), 5))
    if not row["layer_err"] <= problem.spec.rtol:  # NaN fails too
        return {**row, "error": "incorrect: not timed"}
    row["layer_us"] = round(min(time_graph(whole, budget_s=0.3).median_us for _ in range(2)), 2)
    del ref
    fl = floor(problem, inp.experts_touched, ceilings)
    row.update(floor_us=round(fl.floor_us, 2), floor_bound=fl.bound, mbytes=round(fl.bytes / 1e6, 1))
    row["read_best"], read_us = bare_read(fl.bytes)
    gemms, row["gemm_err"] = dense_gemms(problem)
    if not row["gemm_err"] <= 2e-2:
        return {**row, "error": "cuBLAS's dense product disagrees with float32: bounds not timed"}
    row.update(read_us=round(read_us, 2), gemm_us=round(time_graph(gemms, budget_s=0.3).median_us, 2))
    bound_us = max(row["read_us"], row["gemm_us"])
    row.update(bound_us=bound_us, bounded_by="read" if row["read_us"] >= row["gemm_us"] else "gemm")
    for label in ("layer", "read", "gemm", "bound"):
        row[f"{label}_pct"] = round(100 * fl.floor_us / row[f"{label}_us"], 1)
    row["layer_of_bound"] = round(bound_us / row["layer_us"], 3)  # 1.0: the layer at its bound
    return row


def summarize(rows: list[dict]) -> dict:
    """Geometric means over the timed points, and what the goal asks of the layer against its bounds."""
    timed = [r for r in rows if "bound_pct" in r]
    summary = dict(points=len(timed), untimed=[r["point"] for r in rows if "bound_pct" not in r])
    for label in ("layer_pct", "read_pct", "gemm_pct", "bound_pct", "layer_of_bound"):
        xs = [r[label] for r in timed]
        summary[label] = dict(geomean=round(geomean(xs), 3), lowest=min(xs))
    summary["bound_under_60"] = [r["point"] for r in timed if r["bound_pct"] < 60]
    # With every point at the same share of its bound, the share the goal's geometric mean needs.
    summary["goal_needs_layer_of_bound"] = round(GOAL_PCT / summary["bound_pct"]["geomean"], 3)
    return summary


def main(path: str) -> None:
    rows = measure_best_points(path, measure, ("layer_pct", "read_pct", "gemm_pct", "bound_pct", "error"))
    append_summary(path, summarize(rows))


if __name__ == "__main__":
    main(sys.argv[1])
