"""Where the time of one MoE layer goes: GPU time per kernel, from the PyTorch profiler.

The layer runs eagerly (not in a graph) ``reps`` times, with L2 emptied before
each run by the timer's read flush (``moebench.measure.timer.L2Flush``); the flush
kernel is left out of the table.
Kernel times are GPU time, so launch gaps are not counted: compare their sum
with the sweep's graph-replay time to see what the gaps cost.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from moebench.errors import UserError
from moebench.measure.timer import device_flush
from moebench.paths.base import Target
from moebench.paths.registry import get_path
from moebench.problem import Problem, make_inputs
from moebench.tile import TileConfig

_FLUSH_OP = "_read_all"  # the flush kernel's name, unlike any kernel of the layer


def chosen_config(problem: Problem, path_name: str, configs_dir=None) -> tuple[TileConfig | None, str]:
    """The config a sweep runs ``problem`` with when none is given, and its source: moebench's kernel the
    lookup's (tables, the fitted default, the heuristic), another tunable path its default; (None, "") for a
    path without tiles."""
    from moebench.tables import lookup

    path = get_path(path_name)
    if not path.tunable:
        return None, ""
    if path.name != "triton":
        return path.default_config(problem), "heuristic"
    chosen = lookup.for_problem(problem, path.default_config(problem), configs_dir)
    return chosen.config, chosen.label


def kernel_breakdown(problem: Problem, path_name: str = "triton", config: TileConfig | None = None,
                     reps: int = 20) -> list[dict]:
    """Rows of (kernel, calls per layer, GPU µs per layer), slowest first, and a total row; without ``config``
    the one a sweep runs (``chosen_config``)."""
    if not torch.cuda.is_available():
        raise UserError("profile needs a CUDA GPU")
    path = get_path(path_name)
    if reason := path.supports(problem, Target.current()):
        raise UserError(reason)
    inputs = make_inputs(problem, "cuda")
    if path.tunable and config is None:
        config = chosen_config(problem, path_name)[0]
    run = path.prepare(inputs, problem, config)
    out = torch.empty(problem.M, problem.shape.hidden, device="cuda", dtype=problem.spec.act)
    flush = device_flush(torch.device("cuda", torch.cuda.current_device()), mode="read")
    for _ in range(3):  # compile and warm up outside the profile
        run(out)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            run(out)
        torch.cuda.synchronize()
    rows = []
    for evt in prof.key_averages():
        if evt.device_type != torch.autograd.DeviceType.CUDA or _FLUSH_OP in evt.key:
            continue
        rows.append({"kernel": evt.key[:90], "calls": evt.count / reps,
                     "us": evt.device_time_total / reps if hasattr(evt, "device_time_total")
                     else evt.cuda_time_total / reps})
    rows.sort(key=lambda r: -r["us"])
    rows.append({"kernel": "total", "calls": sum(r["calls"] for r in rows), "us": sum(r["us"] for r in rows)})
    return rows
