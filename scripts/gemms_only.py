"""The layer's two GEMMs alone, on the terms of the issue's field anchor, on a GPU.

The issue measured vLLM's Triton fused-MoE kernel with its two expert GEMMs alone in the timed region (73% of
floor as a geometric mean over the 35 points, PyTorch's CUTLASS grouped GEMM 51%), leaving out the align, the
activation quantization, the activation and the top-k sum. The benchmark times moebench's whole layer. This
script times both at each point's best config (``_points.REPORT_RUNS``): the layer as the sweep does, and its
GEMM launches alone, replayed on the tensors one recorded call of the layer made, so GEMM2 reads the h that
call's split-K activation or quantization wrote. What the GEMMs alone still do that vLLM's do not is counted
against them: GEMM1 applies the activation (and, at fp8-block128, quantizes h) in its epilogue, GEMM2 adds
into the top-k sum by atomics, and where the output is too large for GEMM1's programs to zero it, the zeroing
launch is timed with the GEMMs. Both forms are checked against the float32 reference first (the GEMMs alone
with the recorded top-k sum launch run after them where the layer has one), outputs poisoned; both timed by
CUDA-graph replay with L2 flushed, twice interleaved, the faster median kept; floor and ceilings from this run.
At the points the cutlass path runs, its two grouped GEMM calls are timed alone the same way, on the operands
one checked call of its layer gave them: a check that these terms give the anchor's CUTLASS figure.

    PYTHONPATH=$PWD python3 scripts/gemms_only.py $OUT/gemms-only.jsonl
"""

from __future__ import annotations

import sys

import torch
from _points import append_summary, checked_error, geomean, layer, measure_best_points, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.paths import Target, get_path
from moebench.problem import MoEInputs
from moebench.roofline import floor
from moebench.tile import TileConfig
from moebench.timing import time_graph


class Recorder:
    """Stands in for one Triton kernel of the kernels module: launches it, keeping each launch's grid and
    arguments (which keeps the tensors it was given alive)."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.launches: list[tuple] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)
        return launch

    def replay(self) -> None:
        (grid, args, kwargs), = self.launches
        self.kernel[grid](*args, **kwargs)


RECORDED = ("_gemm1_swiglu", "_gemm2_combine", "_topk_sum")


def gemms_alone(inp: MoEInputs, cfg: TileConfig, out: torch.Tensor):
    """Run the layer once into ``out``, recording its GEMM1, GEMM2 and top-k sum launches. Returns ``gemms``,
    which launches GEMM1 and GEMM2 again on the recorded tensors (zeroing GEMM2's atomic target first where
    GEMM1 does not zero it), ``finish``, which launches the recorded top-k sum (nothing
    where GEMM2 adds into the output itself), and GEMM2's output: ``out``, or its [T, H] rows."""
    real = {name: getattr(kernels, name) for name in RECORDED}
    rec = {name: Recorder(kernel) for name, kernel in real.items()}
    try:
        for name, r in rec.items():
            setattr(kernels, name, r)
        layer(kernels, inp, cfg, out)()
    finally:
        for name, kernel in real.items():
            setattr(kernels, name, kernel)
    _, gemm1_args, gemm1_kwargs = rec["_gemm1_swiglu"].launches[0]
    _, gemm2_args, gemm2_kwargs = rec["_gemm2_combine"].launches[0]
    target = gemm2_args[2]  # GEMM2's output: [M, H] sums (atomic) or [T, H] rows
    atomic, zeroed_in_gemm1 = gemm2_kwargs["ATOMIC_SUM"], gemm1_kwargs["ZERO"]
    assert not atomic or target is out, "an atomic GEMM2 here adds into the output itself (atomic_out)"

    def gemms() -> None:
        if atomic and not zeroed_in_gemm1:
            target.zero_()
        rec["_gemm1_swiglu"].replay()
        rec["_gemm2_combine"].replay()

    def finish() -> None:
        if not atomic:
            rec["_topk_sum"].replay()
    return gemms, finish, target


GROUPED_MMS = ("_grouped_mm", "_scaled_grouped_mm")  # the cutlass path's GEMMs (moebench/paths/cutlass_path.py)


def cutlass_gemms_alone(inp: MoEInputs, problem, out: torch.Tensor):
    """Run the cutlass path's layer once into ``out``, recording its two grouped GEMM calls. Returns ``gemms``,
    which calls them again on the recorded operands and returns their products, and the products of the
    recorded calls."""
    calls = []
    real = {name: getattr(torch, name) for name in GROUPED_MMS}

    def recording(fn):
        def call(*args, **kwargs):
            result = fn(*args, **kwargs)
            calls.append((fn, args, kwargs, result))
            return result
        return call
    try:
        for name, fn in real.items():
            setattr(torch, name, recording(fn))
        get_path("cutlass").prepare(inp, problem, None)(out)
    finally:
        for name, fn in real.items():
            setattr(torch, name, fn)
    assert len(calls) == 2, "the cutlass path's layer makes two grouped GEMM calls"
    return (lambda: [fn(*args, **kwargs) for fn, args, kwargs, _ in calls]), [result for *_, result in calls]


def measure(model: str, dtype: str, m: int, cfg: TileConfig, ceilings) -> dict:
    """One point's row: both forms checked, then timed, then placed against the floor."""
    problem, inp, ref, out = point_setup(model, dtype, m)
    whole = layer(kernels, inp, cfg, out)
    gemms, finish, target = gemms_alone(inp, cfg, out)
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), rtol=problem.spec.rtol,
               layer_err=round(checked_error(whole, out, ref), 5),
               gemms_err=round(checked_error(lambda: (gemms(), finish()), out, ref, target), 5))
    if not (row["layer_err"] <= problem.spec.rtol and row["gemms_err"] <= problem.spec.rtol):  # NaN fails too
        return {**row, "error": "incorrect: not timed"}
    for _ in range(2):
        for label, fn in (("layer_us", whole), ("gemms_us", gemms)):
            t = round(time_graph(fn, budget_s=0.3).median_us, 2)
            row[label] = min(t, row.get(label, t))
    fl = floor(problem, inp.experts_touched, ceilings)
    row.update(floor_us=round(fl.floor_us, 2), bound=fl.bound)
    if get_path("cutlass").supports(problem, Target.current()) is None:
        # The cutlass path's layer checked as the sweep checks it, and its grouped GEMMs replayed against the
        # products of the checked call.
        row["cutlass_layer_err"] = round(checked_error(lambda: get_path("cutlass").prepare(inp, problem, None)(out),
                                                       out, ref), 5)
        mms, products = cutlass_gemms_alone(inp, problem, out)
        row["cutlass_replay_err"] = max(((a.float() - b.float()).norm() / b.float().norm()).item()
                                        for a, b in zip(mms(), products, strict=True))
        if row["cutlass_layer_err"] <= problem.spec.rtol and row["cutlass_replay_err"] <= 1e-3:
            row["cutlass_gemms_us"] = round(min(time_graph(mms, budget_s=0.3).median_us for _ in range(2)), 2)
        else:
            row["cutlass_error"] = "incorrect: not timed"
    for label in ("layer", "gemms", "cutlass_gemms"):
        if f"{label}_us" in row:
            row[f"{label}_pct"] = round(100 * fl.floor_us / row[f"{label}_us"], 1)
    return row


def main(path: str) -> None:
    rows = measure_best_points(path, measure, ("layer_pct", "gemms_pct", "cutlass_gemms_pct", "layer_err", "gemms_err"))
    summary = {}
    for over, need in (("all", "gemms_pct"), ("cutlass_points", "cutlass_gemms_pct")):
        timed = [r for r in rows if need in r]
        summary[over] = dict(points=len(timed))
        for label in ("layer_pct", "gemms_pct", "cutlass_gemms_pct"):
            pct = [r[label] for r in timed if label in r]
            if len(pct) == len(timed):
                summary[over][label] = dict(geomean=round(geomean(pct), 1), lowest=min(pct),
                                            under_60=sum(p < 60 for p in pct))
    append_summary(path, summary)


if __name__ == "__main__":
    main(sys.argv[1])
