"""A sweep row's place on the roofline (``bench.sweep.run_config``): ``pct_of_floor`` is ``100 * floor_us / time_us``,
the share of the floor a point reaches (100 at the floor, less the slower it runs). The GPU's timer is replaced by
fixed timings, so the row is built on the CPU as on a GPU."""

from __future__ import annotations

import pytest
import torch

from moebench.bench import sweep
from moebench.bench.sweep import PlannedPoint, run_config
from moebench.measure.roofline import Ceilings, floor
from moebench.measure.timer import Timing
from moebench.models import MoEShape
from moebench.paths.base import Target
from moebench.paths.registry import get_path
from moebench.problem import Problem, make_inputs

CEIL = Ceilings(copy_gbps=4000.0, read_gbps=4500.0, bf16_tflops=800.0, fp8_tflops=1500.0)
# A target that is not the interpreter: the one kind of run whose rows get a floor (the timer is faked below)
GPU_LIKE = Target(torch.device("cpu"), interpreter=False, capability=(9, 0))


@pytest.fixture(scope="module")
def point():
    problem = Problem(MoEShape("m", experts=4, hidden=64, intermediate=32, topk=2), 5, "fp32")
    inputs = make_inputs(problem, "cpu")
    f = floor(problem, inputs.experts_touched, CEIL, problem.slot_flops(inputs.local_slots))
    return PlannedPoint(problem, "torch", None, (None,)), inputs, f


@pytest.mark.parametrize("slower", [1.0, 2.0, 4.0])  # at the floor; twice and four times the floor's time
def test_pct_of_floor_is_the_floor_over_the_time(point, slower, monkeypatch):
    """A point timed at ``slower`` times its floor reaches 100 / slower percent of it."""
    planned, inputs, f = point
    t = f.floor_us * slower
    monkeypatch.setattr(sweep, "time_run", lambda *a, **k: Timing(t, 0.9 * t, 1.1 * t, 10, "faked"))
    row = run_config(planned, get_path("torch"), inputs, None, GPU_LIKE, CEIL, None)
    assert row.status == "ok" and row.time_us == pytest.approx(t) and row.timing_method == "faked"
    assert row.floor_us == pytest.approx(f.floor_us) and row.bound == f.bound
    assert row.pct_of_floor == pytest.approx(100.0 / slower)
    assert row.pct_of_floor <= 100.0  # never above: no point runs faster than its floor


def test_interpreter_rows_get_no_floor(point, monkeypatch):
    """On the interpreter the time is the CPU's: the row has no floor and no share of it."""
    planned, inputs, _ = point
    monkeypatch.setattr(sweep, "time_run", lambda *a, **k: Timing(50.0, 45.0, 55.0, 3, "faked"))
    cpu = Target(torch.device("cpu"), interpreter=True, capability=None)
    row = run_config(planned, get_path("torch"), inputs, None, cpu, CEIL, None)
    assert row.time_us == 50.0 and row.floor_us is None and row.pct_of_floor is None
