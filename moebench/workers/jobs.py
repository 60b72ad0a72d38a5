"""What a worker process runs: a config's first run (compile, no check), and timings of configs (check, then time).

A first run compiles a config's kernels into Triton's on-disk cache, where later runs (the sweep's process, a
timing worker, a server after ``moebench warmup``) find them, isolated from the caller's process: a compiler
crash or a kernel that kills the CUDA context ends a worker, not the run. Sweep ``--tune``, the tuner and
warmup all first-run through ``first_run``; a timing call checks each config at its M (into a NaN-poisoned
output) before it times it (``measure.point``). Results are plain tuples, so they pickle across processes and
Ray.

A worker holds one shape's weights at a time and the inputs of each M it was asked for (up to
``POINTS_BYTES``, the oldest dropped first), with their float32 reference once a check asks for it, so the many
calls of a sweep or a tune rebuild nothing: a tune returns to each M several times, and a reference costs a
float32 copy of every expert's weights. Workers of one compile pool build their
weights one at a time (``share_builds``), and give the build's temporaries back to the GPU before the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

from moebench.problem import Problem
from moebench.tile import TileConfig

# (time_us, p20_us, p80_us, reps, rel_err, failure, error): one config's outcome at one M.
Result = tuple[float | None, float | None, float | None, int | None, float | None, str | None, str | None]
RAN: Result = (None,) * 7  # a first run that ran

# Timing budgets: a screen ranks many configs quickly; a final re-time decides between the few kept.
BUDGETS = {"screen": dict(budget_s=0.01, min_reps=5, max_reps=10, warmup=1),
           "final": dict(budget_s=0.1, min_reps=25, max_reps=100, warmup=2)}
BUDGETS["default"] = BUDGETS["check"] = BUDGETS["final"]  # chosen configs re-timed beside others, as in "final"

# This process's weights (of ``weights_of``: shape, dtype, seed) and its points: problem -> (inputs, ref, out),
# oldest first.
_state: dict = {"weights_of": None, "weights": None, "points": {}}
POINTS_BYTES = 2 << 30  # the most the points of one worker keep on the device
_building = nullcontext()  # in a compile pool, the pool's lock: one worker builds weights at a time


def share_builds(lock) -> None:
    """A compile pool's worker initializer: build weights only while holding ``lock``, the pool's."""
    global _building
    _building = lock


def release() -> None:
    """Drop the weights and inputs this process holds (after first runs in the caller's own process)."""
    _state.update(weights_of=None, weights=None, points={})
    _empty_cache()


def _empty_cache() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _point(problem: Problem, reference: bool):
    """(inputs, reference, out) for ``problem`` on this process's device, built once per M; the float32
    reference once asked for (without ``reference``: None, if none was built yet)."""
    import torch

    from moebench.paths.base import Target
    from moebench.paths.torch_ref import moe_reference
    from moebench.problem import make_inputs, make_weights

    device = Target.current().device
    weights_of = (problem.shape, problem.dtype, problem.seed)
    if _state["weights_of"] != weights_of:
        release()  # one shape's weights at a time
        with _building:
            _empty_cache()
            _state["weights"] = make_weights(problem.shape, problem.dtype, problem.seed, device)
            _empty_cache()  # the build's temporaries, back to the GPU for the next worker's build
        _state["weights_of"] = weights_of
    points = _state["points"]
    if problem not in points:
        inputs = make_inputs(problem, device, _state["weights"])
        out = torch.empty(problem.M, problem.shape.hidden, device=device, dtype=problem.spec.act)
        points[problem] = (inputs, None, out)
    if reference and points[problem][1] is None:
        inputs, _, out = points[problem]
        ref = moe_reference(inputs.x, inputs.weights, inputs.topk_weights, inputs.topk_ids)
        points[problem] = (inputs, ref, out)
        _empty_cache()  # the reference's float32 weights, back to the GPU
    point = points.pop(problem)
    points[problem] = point  # the newest last
    while len(points) > 1 and sum(_point_bytes(p) for p in points.values()) > POINTS_BYTES:
        del points[next(iter(points))]
    return point


def _point_bytes(point) -> int:
    inputs, ref, out = point
    return sum(t.numel() * t.element_size() for t in (inputs.x, out, ref) if t is not None)


def _failed(e: Exception, rel_err: float | None = None) -> Result:
    """The Result of a config whose run raised ``e`` (a UserError: a config the path refuses, an "error")."""
    from moebench.errors import UserError, one_line
    from moebench.measure.failures import classify

    return (None, None, None, None, rel_err, "error" if isinstance(e, UserError) else classify(e), one_line(e))


def first_run(path_name: str, problem: Problem, cfg: TileConfig) -> Result:
    """Compile ``cfg``'s kernels by running them once: ``RAN``, or its failure (typed, one line). No reference
    is built here (a float32 copy of the weights per compile worker would not fit many workers on one GPU);
    a timing call checks each config before it times it."""
    import torch

    from moebench.paths.base import Target
    from moebench.paths.registry import get_path

    try:
        inputs, _, out = _point(problem, reference=False)
        get_path(path_name).prepare(inputs, problem, cfg)(out)
        if Target.current().device.type == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # GPU-side failures become results; the worker goes on
        return _failed(e)
    return RAN


def _check(path_name: str, problem: Problem, cfg: TileConfig):
    """Prepare ``cfg`` and check it once: (run, out, rel_err) or (None, None, Result of its failure)."""
    from moebench.measure.point import check_run, incorrect
    from moebench.paths.registry import get_path

    try:
        inputs, ref, out = _point(problem, reference=True)
        run = get_path(path_name).prepare(inputs, problem, cfg)
        chk = check_run(run, problem, inputs, ref, out)
    except Exception as e:
        return None, None, _failed(e)
    if not chk.correct:
        return None, None, (None, None, None, None, chk.rel_err, "incorrect", incorrect(chk, problem))
    return run, out, chk.rel_err


def time_configs(path_name: str, problem: Problem, configs: Sequence[TileConfig], phase: str) -> list[Result]:
    """Each config checked at this M, then timed at ``phase``'s budget, in order."""
    import torch

    from moebench.measure.point import time_run
    from moebench.measure.timer import time_graph
    from moebench.paths.base import Target
    from moebench.paths.registry import get_path

    target = Target.current()
    path = get_path(path_name)
    results = []
    for cfg in configs:
        run, out, checked = _check(path_name, problem, cfg)
        if run is None:
            results.append(checked)
            continue
        try:
            if target.interpreter:
                t = time_run(run, out, path, target)
            else:
                t = time_graph(lambda run=run, out=out: run(out), **BUDGETS[phase])
        except Exception as e:
            results.append(_failed(e, checked))
            continue
        results.append((t.median_us, t.p20_us, t.p80_us, t.reps, checked, None, None))
        if target.device.type == "cuda":
            torch.cuda.synchronize()
    return results
