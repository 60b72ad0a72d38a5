"""What a tuning worker process runs: a config's first run (compile and check), and timings of configs.

Workers hold one problem's weights at a time, and per M its inputs and float32 reference, so the many calls of
a tune rebuild nothing. A config's first run compiles its kernels (into Triton's on-disk cache, where later
runs find them) and checks the output against the reference, isolated from the tuner's own process: a compiler
crash or a kernel that kills the CUDA context ends a worker, not the tune. A timing call checks each config at
its M (into a NaN-poisoned output) before timing it. Results are plain tuples, so they pickle across processes
and Ray.
"""

from __future__ import annotations

from collections.abc import Sequence

from moebench.problem import Problem
from moebench.tile import TileConfig

# (time_us, p20_us, p80_us, reps, rel_err, failure, error): one config's outcome at one M.
Result = tuple[float | None, float | None, float | None, int | None, float | None, str | None, str | None]

# Timing budgets: a screen ranks many configs quickly; a final re-time decides between the few kept.
BUDGETS = {"screen": dict(budget_s=0.01, min_reps=5, max_reps=10, warmup=1),
           "final": dict(budget_s=0.1, min_reps=25, max_reps=100, warmup=2)}
BUDGETS["default"] = BUDGETS["check"] = BUDGETS["final"]  # chosen configs re-timed beside others, as in "final"

_state: dict = {"weights": None, "weights_of": None, "inputs": {}}


def classify(e: BaseException) -> str:
    """The failure type (``rows.FAILURES``) of an exception a config's run raised."""
    import triton

    text = str(e).lower()
    if isinstance(e, triton.runtime.errors.OutOfResources) or "out of resource" in text or "out of memory" in text:
        return "resources"
    if isinstance(e, triton.CompilationError) or type(e).__name__ == "CompileTimeAssertionFailure":
        return "compile"
    return "error"


def _point(problem: Problem, reference: bool = True):
    """(inputs, reference, out) for ``problem`` on this worker's device, built once per M (without
    ``reference``: the reference is None)."""
    import torch

    from moebench.paths.base import Target
    from moebench.paths.torch_ref import moe_reference
    from moebench.problem import make_inputs, make_weights

    device = Target.current().device
    weights_of = (problem.shape, problem.dtype, problem.seed)
    if _state["weights_of"] != weights_of:
        _state.update(weights=None, inputs={})
        if device.type == "cuda":
            torch.cuda.empty_cache()
        _state["weights"] = make_weights(problem.shape, problem.dtype, problem.seed, device)
        _state["weights_of"] = weights_of
    key = (problem, reference)
    if key not in _state["inputs"]:
        _state["inputs"].clear()  # one M at a time
        inputs = make_inputs(problem, device, _state["weights"])
        ref = moe_reference(inputs.x, inputs.weights, inputs.topk_weights, inputs.topk_ids) if reference else None
        out = torch.empty(problem.M, problem.shape.hidden, device=device, dtype=problem.spec.act)
        _state["inputs"][key] = (inputs, ref, out)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the reference's float32 weights, back to the GPU
    return _state["inputs"][key]


def _check(path_name: str, problem: Problem, cfg: TileConfig):
    """Prepare ``cfg`` and check it once: (run, out, rel_err) or (None, None, Result of its failure)."""
    from moebench.bench.sweep import check_run
    from moebench.errors import UserError, one_line
    from moebench.paths.registry import get_path

    try:
        inputs, ref, out = _point(problem)
        run = get_path(path_name).prepare(inputs, problem, cfg)
        chk = check_run(run, problem, inputs, ref, out)
    except Exception as e:  # GPU-side failures become results; the worker goes on
        return None, None, (None, None, None, None, None, "error" if isinstance(e, UserError) else classify(e),
                            one_line(e))
    if not chk.correct:
        error = f"rel. error {chk.rel_err:.3g} > {problem.spec.rtol:g} against the fp32 reference"
        return None, None, (None, None, None, None, chk.rel_err, "incorrect", error)
    return run, out, chk.rel_err


def first_run(path_name: str, problem: Problem, cfg: TileConfig) -> Result:
    """Compile ``cfg``'s kernels by running them once: no time, or its failure. No reference is built here
    (a float32 copy of the weights per compile worker would not fit many workers on one GPU); the timing
    worker checks each config before it times it."""
    import torch

    from moebench.errors import UserError, one_line
    from moebench.paths.base import Target
    from moebench.paths.registry import get_path

    try:
        inputs = _point(problem, reference=False)[0]
        out = torch.empty(problem.M, problem.shape.hidden, device=inputs.x.device, dtype=problem.spec.act)
        get_path(path_name).prepare(inputs, problem, cfg)(out)
        if Target.current().device.type == "cuda":
            torch.cuda.synchronize()
    except Exception as e:
        return (None, None, None, None, None, "error" if isinstance(e, UserError) else classify(e), one_line(e))
    return (None,) * 7


def time_configs(path_name: str, problem: Problem, configs: Sequence[TileConfig], phase: str) -> list[Result]:
    """Each config checked at this M, then timed at ``phase``'s budget, in order."""
    import torch

    from moebench.bench.sweep import time_run
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
                from moebench.measure.timer import time_graph

                t = time_graph(lambda run=run, out=out: run(out), **BUDGETS[phase])
        except Exception as e:
            from moebench.errors import one_line

            results.append((None, None, None, None, checked, classify(e), one_line(e)))
            continue
        results.append((t.median_us, t.p20_us, t.p80_us, t.reps, checked, None, None))
        if target.device.type == "cuda":
            torch.cuda.synchronize()
    return results
