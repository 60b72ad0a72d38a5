"""The executor: run a sweep's plan point by point on this machine and write the rows.

For each (shape, dtype) the weights are built once; for each M the routed
activations are drawn; for each path the point is first checked against the
float32 reference on a fresh, independent draw (output poisoned with NaN
first), and only a correct point is timed. Rows are appended as they finish.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

import torch
import triton

from moebench.environment import describe, device_name
from moebench.errors import UserError, one_line
from moebench.paths import Target, get_path
from moebench.paths.torch_ref import moe_reference
from moebench.precompile import Precompiler
from moebench.problem import MoEInputs, Problem, make_inputs, make_weights
from moebench.results import RunWriter, new_run_dir
from moebench.roofline import Ceilings, floor, measure_ceilings
from moebench.spec import SweepSpec
from moebench.tile import TileConfig
from moebench.timing import Timing, graph_method, time_eager, time_graph, time_wallclock
from moebench.tuning import candidates

# Failures of a GPU-side kind that become a row, not a crash: out of resources,
# compile errors, and what CUDA or PyTorch report as RuntimeError.
_GPU_ERRORS = (RuntimeError, triton.runtime.errors.OutOfResources, triton.CompilationError)


@dataclass(frozen=True)
class Check:
    correct: bool
    rel_err: float


def check_point(path, problem: Problem, inputs: MoEInputs, config: TileConfig | None = None,
                ref: torch.Tensor | None = None) -> Check:
    """Run ``path`` once on ``inputs`` into a NaN-poisoned output and compare with the fp32 reference."""
    spec = problem.spec
    out = torch.full((problem.M, problem.shape.hidden), float("nan"), device=inputs.x.device, dtype=spec.act)
    if path.tunable and config is None:
        config = path.default_config(problem)
    path.prepare(inputs, problem, config)(out)
    if ref is None:
        ref = moe_reference(inputs.x, inputs.weights, inputs.topk_weights, inputs.topk_ids)
    if not torch.isfinite(out).all():
        return Check(False, float("inf"))
    rel = (torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()
    return Check(rel <= spec.rtol, rel)


def time_point(path, problem: Problem, inputs: MoEInputs, target: Target, config: TileConfig | None = None,
               budget_s: float = 0.3) -> Timing:
    out = torch.empty(problem.M, problem.shape.hidden, device=inputs.x.device, dtype=problem.spec.act)
    run = path.prepare(inputs, problem, config)
    if target.interpreter:
        return time_wallclock(lambda: run(out))
    if path.graph_safe:
        return time_graph(lambda: run(out), budget_s=budget_s)
    return time_eager(lambda: run(out), budget_s=budget_s)


def _base_row(problem: Problem, path_name: str, target: Target) -> dict:
    s = problem.shape
    return dict(
        model=s.name, experts=s.experts, hidden=s.hidden, intermediate=s.intermediate, topk=s.topk,
        moe_layers=s.moe_layers, M=problem.M, dtype=problem.dtype, path=path_name, routing=problem.routing,
        seed=problem.seed, config=None, status="ok", correct=None, rel_err=None, time_us=None,
        time_p20_us=None, time_p80_us=None, reps=None, floor_us=None, bound=None, pct_of_floor=None,
        tflops=None, gbps=None, flops=problem.flops, bytes=None, experts_touched=None,
        device_name=device_name(), interpreter=target.interpreter, timing_method=None, error=None,
    )


def run_point(problem: Problem, path_name: str, inputs: MoEInputs, check_inputs: MoEInputs, target: Target,
              ceilings: Ceilings | None, config: TileConfig | None = None, ref: torch.Tensor | None = None,
              budget_s: float = 0.3) -> dict:
    """One row: check (on ``check_inputs``, against ``ref`` if given), then time, then place on the roofline."""
    path = get_path(path_name)
    row = _base_row(problem, path_name, target)
    reason = path.supports(problem, target)
    if reason:
        return {**row, "status": "unsupported", "error": reason}
    if path.tunable:
        config = config or path.default_config(problem)
        row["config"] = config.as_dict()
    touched = inputs.experts_touched
    row.update(experts_touched=touched, bytes=problem.min_bytes(touched))
    try:
        if path.baseline:  # the reference itself
            chk = Check(True, 0.0)
        else:
            chk = check_point(path, problem, check_inputs, config, ref)
        row.update(correct=chk.correct, rel_err=chk.rel_err)
        if not chk.correct:
            return {**row, "status": "incorrect",
                    "error": f"rel. error {chk.rel_err:.3g} > {problem.spec.rtol:g} against the fp32 reference"}
        t = time_point(path, problem, inputs, target, config, budget_s)
    except _GPU_ERRORS as e:
        return {**row, "status": "error", "error": one_line(e)}
    row.update(time_us=t.median_us, time_p20_us=t.p20_us, time_p80_us=t.p80_us, reps=t.reps,
               timing_method=t.method)
    secs = t.median_us * 1e-6
    row.update(tflops=problem.flops / secs / 1e12, gbps=row["bytes"] / secs / 1e9)
    if ceilings is not None and not target.interpreter:
        f = floor(problem, touched, ceilings)
        row.update(floor_us=f.floor_us, bound=f.bound, pct_of_floor=100.0 * f.floor_us / t.median_us)
    return row


def configs_for(path, problem: Problem, tune: bool, target: Target,
                fixed: Mapping[tuple[str, str, int], TileConfig] | None = None) -> list[TileConfig | None]:
    """The tile configs a point is run with: the one ``fixed`` names for its (model, dtype, M), else the
    candidates when tuning a tunable path, else its default (one row, too, for a point the path cannot run)."""
    if not path.tunable or path.supports(problem, target):
        return [None]
    key = (problem.shape.name, problem.dtype, problem.M)
    if fixed and key in fixed:
        return [fixed[key]]
    return candidates(problem) if tune else [path.default_config(problem)]


def validate(spec: SweepSpec, target: Target) -> None:
    """Refuse, before anything is written, a path that can run none of the sweep's problems here."""
    points = spec.points()
    for name in spec.paths:
        path = get_path(name)
        reasons = [path.supports(p, target) for p, n in points if n == name]
        if all(reasons):
            where = "on this machine (no CUDA GPU)" if target.device.type == "cpu" else "here"
            raise UserError(f"path '{name}' cannot run any point of this sweep {where}: {reasons[0]}")


def run_sweep(spec: SweepSpec, out_base: Path, on_row: Callable[[dict], None] | None = None,
              on_start: Callable[[int], None] | None = None, compile_jobs: int = 0,
              on_note: Callable[[str], None] | None = None,
              configs: Mapping[tuple[str, str, int], TileConfig] | None = None) -> Path:
    """Run every point of ``spec``; return the run folder. ``on_row`` sees each row as it is written.
    ``configs`` pins the tile config of the tunable paths at the points it names ((model, dtype, M), as rows
    name them), in place of the tuner's candidates or the default.

    ``compile_jobs`` > 0 (a tuned sweep on a GPU): that many worker processes compile each tuned point's
    candidates before it is timed (``moebench.precompile``); ``on_note`` is told when they start on a point.
    """
    target = Target.current()
    validate(spec, target)
    points = spec.points()
    if not spec.tune or target.interpreter:
        compile_jobs = 0  # nothing to compile ahead: one config per point, or no compiler (the interpreter)
    meta = describe(target.interpreter)
    meta.update(sweep=spec.name, timing_method=graph_method() if not target.interpreter else "interpreter wall clock",
                points=len(points), tune=spec.tune, compile_jobs=compile_jobs)
    ceilings = None
    if target.device.type == "cuda" and not target.interpreter:
        ceilings = measure_ceilings()
        meta["ceilings"] = ceilings.as_dict()
    writer = RunWriter(new_run_dir(out_base, spec.name), meta)
    if on_start:
        on_start(sum(len(configs_for(get_path(n), p, spec.tune, target, configs)) for p, n in points))
    status = "interrupted"
    precompiler = Precompiler(compile_jobs) if compile_jobs else None
    try:
        for (shape, dtype), group in groupby(points, key=lambda pp: (pp[0].shape, pp[0].dtype)):
            group = list(group)
            runnable = [(p, n) for p, n in group if not get_path(n).supports(p, target)]
            weights = make_weights(shape, dtype, spec.seed, target.device) if runnable else None
            for _, by_m in groupby(group, key=lambda pp: pp[0].M):
                by_m = list(by_m)
                inputs = check_inputs = None
                if weights is not None:
                    inputs = make_inputs(by_m[0][0], target.device, weights, draw=0)
                    check_inputs = make_inputs(by_m[0][0], target.device, weights, draw=1)
                ref = None  # the fp32 reference on check_inputs, computed once for all paths and configs
                for problem, path_name in by_m:
                    path = get_path(path_name)
                    reason = path.supports(problem, target)
                    if reason:
                        rows = [{**_base_row(problem, path_name, target), "status": "unsupported", "error": reason}]
                    else:
                        if ref is None and not path.baseline:
                            ci = check_inputs
                            ref = moe_reference(ci.x, ci.weights, ci.topk_weights, ci.topk_ids)
                        tiles = configs_for(path, problem, spec.tune, target, configs)
                        if precompiler and path.tunable and len(tiles) > 1:
                            if on_note:
                                on_note(f"compiling {len(tiles)} configs of {problem.shape.name} {problem.dtype} "
                                        f"M={problem.M} ahead")
                            precompiler.compile(path_name, problem, tiles)
                        rows = (run_point(problem, path_name, inputs, check_inputs, target, ceilings, cfg, ref,
                                          budget_s=0.1 if spec.tune else 0.3)
                                for cfg in tiles)
                    for row in rows:
                        writer.append(row)
                        if on_row:
                            on_row(row)
            del weights
            if target.device.type == "cuda":
                torch.cuda.empty_cache()
        status = "complete"
    finally:
        extra = {}
        if precompiler:
            precompiler.close()
            if precompiler.broken:
                extra["compile_jobs_stopped"] = precompiler.broken
        writer.finish(status, **extra)
    return writer.run_dir
