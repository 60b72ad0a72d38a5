"""The executor: run a sweep's plan point by point on this machine and write the rows.

The plan is built once (``SweepPlan``): each (problem, path) with whether the path can run it here and the tile
config it is run with; a tuned sweep (``--tune``) first tunes its tunable points with ``moebench tune``'s search
(``bench.tuned``) and builds the plan again with the configs chosen. For each (shape, dtype) the weights are built
once; for each M the routed activations are drawn once and the float32 reference computed once. Each config is
prepared once, and that one closure is first checked (into a NaN-poisoned output, against the reference) and, only
if correct, timed. Rows are appended as they finish; the same sweep started again continues a stopped run's
folder, skipping the rows it has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from itertools import groupby
from pathlib import Path

import torch

from moebench.bench.spec import SweepSpec
from moebench.bench.tuned import Pins, tune_pins
from moebench.environment import describe, device_name
from moebench.errors import UserError, one_line
from moebench.measure.failures import classify, is_gpu_side
from moebench.measure.point import Check, check_run, incorrect, time_run
from moebench.measure.roofline import Ceilings, floor, measure_ceilings
from moebench.measure.timer import run_method
from moebench.paths.base import MoEPath, Target
from moebench.paths.registry import get_path
from moebench.paths.torch_ref import moe_reference
from moebench.problem import MoEInputs, Problem, check_fits, make_inputs, make_weights
from moebench.store.resume import find_resumable, request_key, row_identity, stopped_in
from moebench.store.rows import Row
from moebench.store.runfolder import RunWriter, new_run_dir
from moebench.tables import lookup
from moebench.tile import TileConfig
from moebench.tune.strategies.fast import INTERPRETER

Pinned = Mapping[tuple[str, str, int], TileConfig]  # (model, dtype, M) -> the config to run there


@dataclass(frozen=True)
class PlannedPoint:
    """One (problem, path) of a sweep, decided once: whether the path runs it here, and with which configs."""

    problem: Problem
    path_name: str
    reason: str | None  # why the path cannot run the problem here; None where it can
    tiles: tuple[TileConfig | None, ...]  # a row each; (None,): the path's own choice, or unsupported
    source: str | None = None  # where the tiles came from (Row.config_source); None for a path without tiles


def _tiles(path: MoEPath, problem: Problem, reason: str | None, tune: bool, pinned: Pinned | None,
           configs_dir: Path | None = None) -> tuple[tuple[TileConfig | None, ...], str | None]:
    """The tile config a point is run with and where it came from: the one ``pinned`` names for its
    (model, dtype, M), else, in a tuned sweep, the path's default until its tune's choice replaces it
    (``with_tuned``), else, for moebench's kernel, the config its tables give at M (``moebench.tables.lookup``:
    --configs, MOEBENCH_CONFIGS, shipped, else the fitted default, else the heuristic), else the path's default (one
    row, too, for a point the path cannot run)."""
    if not path.tunable or reason:
        return (None,), None
    key = (problem.shape.name, problem.dtype, problem.M)
    if pinned and key in pinned:
        return (pinned[key],), "pinned"
    if tune:
        return (path.default_config(problem),), "tuned"
    if path.name != "triton":
        return (path.default_config(problem),), "heuristic"
    chosen = lookup.for_problem(problem, path.default_config(problem), configs_dir)
    return (chosen.config,), chosen.label


@dataclass(frozen=True)
class SweepPlan:
    """A sweep's points on one target, each decided once. ``build`` refuses (UserError), before anything is
    written, a path that can run none of the sweep's problems here."""

    spec: SweepSpec
    target: Target
    points: tuple[PlannedPoint, ...]

    @classmethod
    def build(cls, spec: SweepSpec, target: Target, pinned: Pinned | None = None,
              configs_dir: Path | None = None) -> SweepPlan:
        points = []
        for problem, name in spec.points():
            path = get_path(name)
            reason = path.supports(problem, target)
            tiles, source = _tiles(path, problem, reason, spec.tune, pinned, configs_dir)
            points.append(PlannedPoint(problem, name, reason, tiles, source))
        for name in spec.paths:
            reasons = [p.reason for p in points if p.path_name == name]
            if all(reasons):
                where = "on this machine (no CUDA GPU)" if target.device.type == "cpu" else "here"
                raise UserError(f"path '{name}' cannot run any point of this sweep {where}: {reasons[0]}")
        return cls(spec, target, tuple(points))

    def with_tuned(self, tuned: Pins) -> SweepPlan:
        """The plan with each tuned point run with the config its tune chose (``tuned``, by model, dtype, M and
        path)."""
        def chosen(p: PlannedPoint) -> PlannedPoint:
            key = (p.problem.shape.name, p.problem.dtype, p.problem.M, p.path_name)
            return replace(p, tiles=(tuned[key],)) if p.source == "tuned" and key in tuned else p

        return replace(self, points=tuple(chosen(p) for p in self.points))

    @property
    def rows(self) -> int:
        """The rows a run of the plan writes: one per (point, config)."""
        return sum(len(p.tiles) for p in self.points)


def validate(spec: SweepSpec, target: Target, pinned: Pinned | None = None,
             configs_dir: Path | None = None) -> SweepPlan:
    """The sweep's plan on ``target``; UserError for a path that can run none of its problems here, a
    ``configs_dir`` that is not a folder, or a point that cannot fit in the device's memory."""
    plan = SweepPlan.build(spec, target, pinned, lookup.check_dir(configs_dir))
    checked: dict[Problem, bool] = {}  # each problem that runs: whether a path checked against the reference runs it
    for p in plan.points:
        if p.reason is None:
            checked[p.problem] = checked.get(p.problem, False) or not get_path(p.path_name).baseline
    for problem, reference in checked.items():
        check_fits([problem], target.device, reference)
    return plan


def run_config(point: PlannedPoint, path: MoEPath, inputs: MoEInputs, ref: torch.Tensor | None, target: Target,
               ceilings: Ceilings | None, config: TileConfig | None, budget_s: float = 0.3) -> Row:
    """One row: prepare once; check that closure against ``ref`` (the fp32 reference on ``inputs``; the
    baseline path is the reference and is not checked); time the same closure only if correct; place it on
    the roofline."""
    problem = point.problem
    row = Row.for_point(problem, point.path_name, target)
    if path.tunable:
        source = point.source if config is not None else "heuristic"
        config = config or path.default_config(problem)
        row = replace(row, config=config.as_dict(), config_source=source)
    touched, flops = inputs.experts_touched, problem.slot_flops(inputs.local_slots)  # local experts' work only
    row = replace(row, experts_touched=touched, bytes=problem.min_bytes(touched), flops=flops)
    out = torch.empty(problem.M, problem.shape.hidden, device=inputs.x.device, dtype=problem.spec.act)
    try:
        run = path.prepare(inputs, problem, config)
        chk = Check(True, 0.0) if path.baseline else check_run(run, problem, inputs, ref, out)
        row = replace(row, correct=chk.correct, rel_err=chk.rel_err)
        if not chk.correct:
            return replace(row, status="incorrect", failure="incorrect", error=incorrect(chk, problem))
        t = time_run(run, out, path, target, budget_s)
    except Exception as e:  # a GPU-side failure is the row's; any other propagates
        if not is_gpu_side(e):
            raise
        return replace(row, status="error", failure=classify(e), error=one_line(e))
    secs = t.median_us * 1e-6
    row = replace(row, time_us=t.median_us, time_p20_us=t.p20_us, time_p80_us=t.p80_us, reps=t.reps,
                  timing_method=t.method, tflops=flops / secs / 1e12, gbps=row.bytes / secs / 1e9)
    if ceilings is not None and not target.interpreter:
        f = floor(problem, touched, ceilings, flops)
        row = replace(row, floor_us=f.floor_us, bound=f.bound, pct_of_floor=100.0 * f.floor_us / t.median_us)
    return row


def _point_rows(point: PlannedPoint, inputs: MoEInputs | None, ref: torch.Tensor | None, target: Target,
                ceilings: Ceilings | None) -> Iterator[Row]:
    """The rows of one planned point, as each finishes: one per config, or one saying why it cannot run."""
    if point.reason:
        yield replace(Row.for_point(point.problem, point.path_name, target), status="unsupported",
                      error=point.reason)
        return
    path = get_path(point.path_name)
    for cfg in point.tiles:
        yield run_config(point, path, inputs, ref, target, ceilings, cfg)


def planned_identity(point: PlannedPoint, tile: TileConfig | None, target: Target) -> tuple:
    """The ``row_identity`` of the row that running ``point`` with ``tile`` writes on ``target``."""
    row = Row.for_point(point.problem, point.path_name, target)
    return row_identity(replace(row, config=tile.as_dict() if tile is not None else None).as_dict())


def sweep_request(plan: SweepPlan) -> dict:
    """What a sweep is asked to do, as plain data for ``request_key``: its name, the device, the tune flag, and
    the identity of every row the plan writes (points, paths, routing, seed, tile configs, pinned ones
    included); not where its folder goes, nor how progress shows."""
    rows = [list(planned_identity(p, tile, plan.target)) for p in plan.points for tile in p.tiles]
    return {"kind": "sweep", "name": plan.spec.name, "device": device_name(), "interpreter": plan.target.interpreter,
            "tune": plan.spec.tune, "rows": rows}


def _left_to_run(plan: SweepPlan, done: set[tuple]) -> list[PlannedPoint]:
    """The plan's points less the configs whose rows are in ``done`` (row identities); points left empty go."""
    left = []
    for p in plan.points:
        tiles = tuple(t for t in p.tiles if planned_identity(p, t, plan.target) not in done)
        if tiles:
            left.append(replace(p, tiles=tiles))
    return left


def _ep_map(spec: SweepSpec) -> dict | None:
    """meta.json's ``ep_map``, written where a shape runs through an expert_map (sweep --ep-map): per such shape,
    its global and local experts (rank 0 holds global ids 0..local-1)."""
    mapped = {s.name: {"global_experts": s.routed_experts, "local_experts": s.experts} for s in spec.shapes if s.mapped}
    return mapped or None


def run_sweep(spec: SweepSpec | SweepPlan, out_base: Path, on_row: Callable[[dict], None] | None = None,
              on_start: Callable[[int], None] | None = None, compile_jobs: int | None = None,
              on_note: Callable[[str], None] | None = None, configs: Pinned | None = None, resume: bool = True,
              on_resume: Callable[[Path, dict], None] | None = None,
              on_tune: Callable[[str, int, int], None] | None = None) -> Path:
    """Run every point of ``spec`` (or of a plan ``validate`` built); return the run folder. ``on_start`` is
    told how many rows are left to run, ``on_row`` sees each row as it is written. ``configs`` pins the tile
    config of the tunable paths at the points it names ((model, dtype, M), as rows name them), in place of the
    tune's choice or the default.

    A tuned sweep first tunes its tunable points not pinned (``bench.tuned.tune_pins``: ``moebench tune``'s
    search per path, shape and dtype over the sweep's M, its run folders under ``out_base``, a finished one of the
    same request read again; ``compile_jobs``, ``on_note`` and, as ``on_progress``, ``on_tune`` go to it; on the
    interpreter its search is cut short: ``tune.strategies.fast.INTERPRETER``) and runs each point once with the config
    chosen; meta.json names the tunes' folders (``tune_runs``).

    With ``resume``, a stopped run of the same request (``sweep_request``) under ``out_base`` is continued in
    its folder (``store.resume.find_resumable``): its rows are kept and skipped, and ``on_resume`` gets the folder
    and the record of the reopening. Ctrl-C or SIGTERM (``results.stop_on_sigterm``) raise
    ``store.resume.Interrupted`` naming the folder, which records "interrupted"; another exception, "failed".
    """
    if isinstance(spec, SweepPlan):
        if configs:
            raise ValueError("pin configs when the plan is built (validate), not when it is run")
        plan = spec
    else:
        plan = SweepPlan.build(spec, Target.current(), configs)
    spec, target = plan.spec, plan.target
    tune_runs: list[Path] = []
    if spec.tune:
        todo = [(p.problem, p.path_name) for p in plan.points if p.reason is None and p.source == "tuned"]
        tuned, tune_runs = tune_pins(todo, out_base, compile_jobs=compile_jobs, on_note=on_note, on_progress=on_tune,
                                     options=INTERPRETER if target.interpreter else ())
        plan = plan.with_tuned(tuned)
    request = request_key(sweep_request(plan))
    resumable = find_resumable(out_base, request) if resume else None  # refuses a folder a live process writes
    meta = describe(target.interpreter)
    meta.update(sweep=spec.name, timing_method=run_method(target.interpreter),
                points=len(plan.points), tune=spec.tune, request=request)
    if spec.tune:
        meta["tune_runs"] = [r.name for r in tune_runs]  # folders beside the sweep's, under the same --out
    if mapped := _ep_map(spec):
        meta["ep_map"] = mapped
    ceilings = None
    if target.device.type == "cuda" and not target.interpreter:
        ceilings = measure_ceilings()
        meta["ceilings"] = ceilings.as_dict()
    writer = RunWriter(resumable or new_run_dir(out_base, spec.name), meta, resume=resumable is not None)
    stopped: BaseException | None = None
    try:
        if writer.resumed and on_resume:
            on_resume(writer.run_dir, writer.resumed)
        points = _left_to_run(plan, {row_identity(r) for r in writer.kept})
        if on_start:
            on_start(sum(len(p.tiles) for p in points))
        for (shape, dtype), group in groupby(points, key=lambda p: (p.problem.shape, p.problem.dtype)):
            group = list(group)
            runs = any(p.reason is None for p in group)
            weights = make_weights(shape, dtype, spec.seed, target.device) if runs else None
            for _, by_m in groupby(group, key=lambda p: p.problem.M):
                by_m = list(by_m)
                inputs = make_inputs(by_m[0].problem, target.device, weights) if weights is not None else None
                ref = None  # the fp32 reference on inputs: computed once, for the first point checked
                for point in by_m:
                    if point.reason is None and ref is None and not get_path(point.path_name).baseline:
                        ref = moe_reference(inputs.x, inputs.weights, inputs.topk_weights, inputs.topk_ids,
                                            expert_map=inputs.expert_map)
                    for row in _point_rows(point, inputs, ref, target, ceilings):
                        record = row.as_dict()
                        writer.append(record)
                        if on_row:
                            on_row(record)
            del weights
            if target.device.type == "cuda":
                torch.cuda.empty_cache()
    except BaseException as e:
        stopped = stopped_in(e, writer.run_dir)
        if stopped is e:
            raise
        raise stopped from e
    finally:
        writer.end(stopped)
    return writer.run_dir
