"""Check, then time, one prepared part, as a sweep checks and times a point: its closure is run once into a
NaN-poisoned output and compared with its float32 reference (the dtype's tolerance, ``moebench.dtypes``); only a
correct part is timed, the same closure into the same output: CUDA-graph replay with L2 emptied on a GPU (eager
per-call events for a closure that synchronizes), wall clock on the CPU (correctness only). Its floor is placed
against the ceilings measured in the run."""

from __future__ import annotations

from collections.abc import Callable

import torch

from moebench.errors import one_line
from moebench.measure.failures import classify, is_gpu_side
from moebench.measure.point import Check
from moebench.measure.roofline import Ceilings
from moebench.measure.timer import Timing, time_eager, time_graph, time_wallclock
from moebench.paths.base import Target
from moebench.step.parts import Prepared


def check_part(p: Prepared) -> Check:
    """``p`` run once into its NaN-poisoned output, against its float32 reference (rel. Frobenius error)."""
    p.out.fill_(float("nan"))
    p.run()
    ref = p.reference()
    if not torch.isfinite(p.out).all():
        return Check(False, float("inf"))
    rel = (torch.linalg.vector_norm(p.out.float() - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()
    return Check(rel <= p.rtol, rel)


def time_closure(run: Callable[[], None], graph_safe: bool, target: Target, budget_s: float = 0.3) -> Timing:
    """The timer a sweep would use for ``run``: wall clock on the interpreter, else graph replay where it is
    graph-safe, else eager launches."""
    if target.interpreter or target.device.type != "cuda":
        return time_wallclock(run)
    if graph_safe:
        return time_graph(run, budget_s=budget_s)
    return time_eager(run, budget_s=budget_s)


def floor_us(nbytes: int, flops: int, matmul_dtype: str, ceilings: Ceilings) -> tuple[float, str]:
    """The slower of moving ``nbytes`` at the memory ceiling and ``flops`` at the dtype's matmul rate."""
    mem = nbytes / (ceilings.mem_gbps * 1e9) * 1e6
    cmp = flops / (ceilings.matmul_tflops(matmul_dtype) * 1e12) * 1e6
    return max(mem, cmp), "memory" if mem >= cmp else "compute"


def measure_part(p: Prepared, row: dict, target: Target, ceilings: Ceilings | None, budget_s: float = 0.3) -> dict:
    """``row`` completed for ``p``: its check, its time only if correct, its floor; a GPU-side failure is the row's
    ("error"), any other exception propagates."""
    notes = list(dict.fromkeys(p.notes))
    extra = {k: v for k, v in p.extra.items() if k in row}
    row = {**row, **extra, "part": p.part, "bytes": p.bytes, "flops": p.flops, "measured": True, "status": "ok",
           "note": "; ".join(notes) or None}
    try:
        if p.reference is not None:
            chk = check_part(p)
            row.update(correct=chk.correct, rel_err=chk.rel_err)
            if not chk.correct:
                return {**row, "status": "incorrect",
                        "error": f"rel. error {chk.rel_err:.3g} > {p.rtol:g} against the float32 reference"}
        t = time_closure(p.run, p.graph_safe, target, budget_s)
    except Exception as e:
        if not is_gpu_side(e):
            raise
        return {**row, "status": "error", "error": f"{classify(e)}: {one_line(e)}"}
    row.update(time_us=t.median_us, time_p20_us=t.p20_us, time_p80_us=t.p80_us, reps=t.reps, timing_method=t.method)
    if ceilings is not None and not target.interpreter:
        f, bound = floor_us(p.bytes, p.flops, p.matmul_dtype, ceilings)
        row.update(floor_us=f, bound=bound, pct_of_floor=100.0 * f / t.median_us)
    return row
