"""Check, then time, one prepared point: the closure a path's ``prepare`` returned, on the inputs it was
prepared on.

The check runs the closure once into a NaN-poisoned output and compares it with the float32 reference (a
kernel that writes nothing fails, it does not pass on stale memory); only a correct closure is timed, the
same closure into the same output, so the time is of what was checked. The sweep's rows and the tuner's
timing workers both measure through these.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moebench.measure.timer import Timing, time_eager, time_graph, time_wallclock
from moebench.paths.base import MoEPath, RunFn, Target
from moebench.paths.torch_ref import moe_reference
from moebench.problem import MoEInputs, Problem


@dataclass(frozen=True)
class Check:
    correct: bool
    rel_err: float


def check_run(run: RunFn, problem: Problem, inputs: MoEInputs, ref: torch.Tensor | None = None,
              out: torch.Tensor | None = None) -> Check:
    """Run the prepared closure ``run`` once into a NaN-poisoned output (``out`` [M, hidden], or a new
    one) and compare with the fp32 reference on ``inputs`` (``ref`` [M, hidden], computed if not given)."""
    if out is None:
        out = torch.empty(problem.M, problem.shape.hidden, device=inputs.x.device, dtype=problem.spec.act)
    out.fill_(float("nan"))
    run(out)
    if ref is None:
        ref = moe_reference(inputs.x, inputs.weights, inputs.topk_weights, inputs.topk_ids,
                            expert_map=inputs.expert_map)
    if not torch.isfinite(out).all():
        return Check(False, float("inf"))
    rel = (torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()
    return Check(rel <= problem.spec.rtol, rel)


def incorrect(check: Check, problem: Problem) -> str:
    """The error line of a check that failed."""
    return f"rel. error {check.rel_err:.3g} > {problem.spec.rtol:g} against the fp32 reference"


def time_run(run: RunFn, out: torch.Tensor, path: MoEPath, target: Target, budget_s: float = 0.3) -> Timing:
    """Time the prepared closure ``run`` writing ``out``: graph replay where the path allows it."""
    if target.interpreter:
        return time_wallclock(lambda: run(out))
    if path.graph_safe:
        return time_graph(lambda: run(out), budget_s=budget_s)
    return time_eager(lambda: run(out), budget_s=budget_s)
