"""Timing each point's two bounds: a bare read of its bytes and cuBLAS's dense GEMMs of its shapes.

``run_bounds`` is what ``moebench bounds`` runs on a GPU: the ceilings first, as every GPU run measures
them, then per point the fastest of several one-launch readers of the floor's bytes and the two dense GEMMs,
each checked before it is timed (a reader's sum against the buffer's, a product against float32), timed by
CUDA-graph replay with L2 emptied. The measuring functions take the device and a timer, so the CPU tests run
them on tiny shapes with a timer of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import torch

from moebench.errors import UserError, one_line, os_error_line
from moebench.hardware import DeviceLimits
from moebench.kernels.stream import read_all
from moebench.measure.failures import is_gpu_side
from moebench.measure.roofline import Ceilings, floor, measure_ceilings
from moebench.measure.timer import graph_method, time_graph
from moebench.probes.bounds import (
    GemmShape,
    bound_fields,
    dense_gemm_shapes,
    mixing_warnings,
    problem_of,
    summarize,
)
from moebench.store.runfolder import RunWriter, check_out_dir, ensure_out_dir, new_run_dir

Timer = Callable[[Callable[[], None]], float]  # median microseconds of one call of a closure

GEMM_RTOL = 2e-2  # a dense product against float32 of the same operands: bf16 output rounding is ~2e-3
READ_RTOL = 1e-3  # a reader's sum of positive values against float64: float32 accumulation only
READ_PROGRAMS_PER_SM = (1, 2, 4, 8)  # a flat read's grid: a short read wants few programs, a long one more
READ_BLOCKS = (4096, 8192)  # elements each program loads per step

# The integer columns of a result row.
INT_COLUMNS = ("experts", "hidden", "intermediate", "topk", "moe_layers", "M", "seed", "reps", "flops", "bytes",
               "experts_touched")


def graph_timer(budget_s: float = 0.2) -> Timer:
    """CUDA-graph replay with L2 emptied before each replay (``time_graph``): the timing method of GPU runs."""
    return lambda fn: time_graph(fn, budget_s=budget_s, min_reps=20, max_reps=100).median_us


def readers(buf: torch.Tensor, sms: int) -> dict[str, tuple[Callable[[], None], torch.Tensor]]:
    """One-launch reads of all of ``buf``, by name: (the closure, the tensor whose sum is what it read)."""
    total = torch.empty((), device=buf.device, dtype=torch.float32)  # []
    reads = {"torch.sum": (lambda: torch.sum(buf, dim=0, dtype=torch.float32, out=total), total)}
    for per_sm in READ_PROGRAMS_PER_SM:
        for block in READ_BLOCKS:
            partial = torch.empty(sms * per_sm, device=buf.device, dtype=torch.float32)  # [programs]
            reads[f"read_all p{per_sm} b{block}"] = (
                lambda p=partial, b=block: read_all(buf, p, block=b, num_warps=8), partial)
    return reads


def bare_read(nbytes: int, device: torch.device | str, timer: Timer, sms: int) -> tuple[str, float]:
    """(name, median us) of the fastest reader of ``nbytes`` contiguous bytes of random bf16, each reader
    checked first: what it summed must be the buffer's sum."""
    gen = torch.Generator(device=device).manual_seed(0)
    buf = torch.rand(nbytes // 2, generator=gen, device=device, dtype=torch.bfloat16)  # [nbytes / 2], positive
    want = buf.sum(dtype=torch.float64).item()
    times = {}
    for name, (fn, result) in readers(buf, sms).items():
        result.fill_(float("nan"))
        fn()
        got = result.sum(dtype=torch.float64).item()
        if not abs(got - want) <= READ_RTOL * want:  # NaN fails too
            raise RuntimeError(f"reader {name} summed {got:.6g} of a buffer whose sum is {want:.6g}")
        times[name] = timer(fn)
    name = min(times, key=times.get)
    return name, times[name]


def dense_gemms(shapes: Sequence[GemmShape], dtype: str, device: torch.device | str,
                seed: int = 0) -> tuple[Callable[[], None], float]:
    """The dense products ``[rows, k] @ w.T`` of ``shapes`` (``torch.mm`` in the dtype's activation type; at
    fp8 ``torch._scaled_mm`` of e4m3 operands with per-tensor scales, bf16 out) as one closure, and their
    largest relative error against a float32 product of the same operands (outputs set to NaN first)."""
    from moebench.dtypes import get_dtype

    spec = get_dtype(dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    build = torch.bfloat16 if spec.is_fp8 else spec.act
    operands = []
    for g in shapes:
        a = torch.randn(g.rows, g.k, generator=gen, device=device, dtype=build)  # [rows, k]
        w = torch.randn(g.n, g.k, generator=gen, device=device, dtype=build)  # [n, k]: one expert's weights
        if spec.is_fp8:
            a, w = a.to(spec.weight), w.to(spec.weight)
        operands.append((a, w, torch.empty(g.rows, g.n, device=device, dtype=spec.act)))  # out [rows, n]
    one = torch.ones((), device=device, dtype=torch.float32)

    def run() -> None:
        for a, w, out in operands:
            if spec.is_fp8:  # w.t() is the column-major [k, n] operand _scaled_mm wants
                torch._scaled_mm(a, w.t(), one, one, out_dtype=spec.act, out=out)
            else:
                torch.mm(a, w.t(), out=out)

    for _, _, out in operands:
        out.fill_(float("nan"))
    run()
    errs = []
    for a, w, out in operands:
        want = a.float() @ w.float().t()
        errs.append((torch.linalg.vector_norm(out.float() - want) / torch.linalg.vector_norm(want)).item())
    return run, max(errs)


def measure_point(point: dict, ceilings: Ceilings, device: torch.device | str, timer: Timer, sms: int) -> dict:
    """One point's bounds row: its layer time (from its run's row), its floor under ``ceilings``, the bare read
    of the floor's bytes and the dense GEMMs, each checked, then timed; ``error`` says why a bound is missing."""
    problem = problem_of(point)
    fl = floor(problem, int(point["experts_touched"]), ceilings)
    row = dict(model=point["model"], dtype=point["dtype"], M=int(point["M"]), topk=int(point["topk"]),
               routing=point.get("routing"), layer_us=float(point["time_us"]), floor_us=fl.floor_us,
               floor_bound=fl.bound, run=point.get("run"), error=None)
    try:
        row["reader"], read_us = bare_read(fl.bytes, device, timer, sms)
        gemms, row["gemm_err"] = dense_gemms(dense_gemm_shapes(problem), problem.dtype, device)
        if not row["gemm_err"] <= GEMM_RTOL:  # NaN fails too
            return {**row, "error": f"cuBLAS's dense product is {row['gemm_err']:.3g} off float32: not timed"}
        gemm_us = timer(gemms)
    except Exception as e:  # a GPU-side failure ends this point's measurement, not the run
        if not is_gpu_side(e):
            raise
        return {**row, "error": one_line(e)}
    return {**row, **bound_fields(row["layer_us"], fl.floor_us, read_us, gemm_us)}


def measure_points(points: pd.DataFrame, ceilings: Ceilings, device: torch.device | str, timer: Timer,
                   sms: int, on_row: Callable[[dict, dict], None] | None = None) -> list[dict]:
    """``measure_point`` for each row of ``points`` in order; ``on_row(point, row)`` sees each as it finishes."""
    rows = []
    for point in points.to_dict("records"):
        row = measure_point(point, ceilings, device, timer, sms)
        rows.append(row)
        if on_row:
            on_row(point, row)
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return rows


def run_row(point: dict, row: dict, ceilings: Ceilings) -> dict:
    """A row for a bounds run folder: the point's own row (every result column) with its floor placed under
    this run's ``ceilings`` and the bound's fields added; ``source_run`` names the run it came from."""
    problem = problem_of(point)
    fl = floor(problem, int(point["experts_touched"]), ceilings)
    extra = {k: v for k, v in row.items() if k not in ("model", "dtype", "M", "topk", "routing", "run", "error")}
    own = {k: int(v) if k in INT_COLUMNS and isinstance(v, float) and v.is_integer() else v
           for k, v in point.items() if k != "run"}  # a column with a missing value reads back as floats
    out = {**own, **extra, "source_run": point.get("run")}
    out.update(floor_us=fl.floor_us, bound=fl.bound, pct_of_floor=100.0 * fl.floor_us / float(point["time_us"]))
    if row.get("error"):
        out["error"] = f"bounds: {row['error']}"
    return out


def _create_out_dir(out_base: Path) -> None:
    try:
        ensure_out_dir(out_base)
    except OSError as e:
        raise UserError(f"--out {os_error_line(e)}") from None


def open_writer(out_base: Path, meta: dict) -> RunWriter:
    """A fresh ``bounds`` run folder under ``out_base`` (created here); an OS refusal is one line."""
    _create_out_dir(out_base)
    try:
        return RunWriter(new_run_dir(out_base, "bounds"), meta)
    except OSError as e:
        raise UserError(f"cannot create a run folder: {os_error_line(e)}") from None


def preflight(points: pd.DataFrame, out_base: Path | None) -> list[str]:
    """Refuse, before anything is measured, printed or created, a machine without a CUDA GPU and an ``--out``
    that cannot hold run folders; return the warnings to show first (``mixing_warnings``: layer times from another
    GPU or timing method)."""
    from moebench.environment import device_name
    from moebench.paths.base import Target

    target = Target.current()
    if target.device.type != "cuda" or target.interpreter:
        raise UserError("moebench bounds times a read and cuBLAS on a CUDA GPU; this machine has none "
                        "(the Triton interpreter's times bound nothing)")
    if out_base is not None:
        check_out_dir(out_base)
    return mixing_warnings(points, device_name(), graph_method())


def run_bounds(points: pd.DataFrame, out_base: Path | None = None,
               on_start: Callable[[Ceilings], None] | None = None,
               on_row: Callable[[dict], None] | None = None) -> tuple[list[dict], Ceilings, Path | None]:
    """Measure the ceilings, then every point's bounds on this GPU; with ``out_base``, also write a run folder
    (meta.json: the machine, the command and the ceilings; rows.jsonl: ``run_row`` of each point). Returns the
    bounds rows, the ceilings and the run folder. Refuses what ``preflight`` refuses."""
    from moebench.environment import describe

    preflight(points, out_base)
    ceilings = measure_ceilings()
    if on_start:
        on_start(ceilings)
    writer = None
    if out_base is not None:
        meta = {**describe(False), "probe": "bounds", "timing_method": graph_method(), "points": len(points),
                "sources": sorted({str(r) for r in points["run"]}), "ceilings": ceilings.as_dict()}
        writer = open_writer(out_base, meta)
    rows: list[dict] = []

    def finished(point: dict, row: dict) -> None:
        rows.append(row)
        if writer:
            writer.append(run_row(point, row, ceilings))
        if on_row:
            on_row(row)

    status = "interrupted"
    try:
        measure_points(points, ceilings, "cuda", graph_timer(), DeviceLimits.current().sms, finished)
        status = "complete"
    finally:
        if writer:
            writer.finish(status, summary=summarize(rows))
    return rows, ceilings, writer.run_dir if writer else None
