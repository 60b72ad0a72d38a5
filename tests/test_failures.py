"""The one failure classifier (``measure.failures``): which exceptions are GPU-side and their type, and a sweep's
row of a point whose run raised one: an error row with that type, where any other exception propagates."""

from __future__ import annotations

import pytest
import torch
import triton

from moebench.bench import sweep
from moebench.bench.sweep import PlannedPoint, run_config
from moebench.measure.failures import classify, is_gpu_side, out_of_memory, out_of_resources
from moebench.models import MoEShape
from moebench.paths.base import Target
from moebench.paths.registry import get_path
from moebench.problem import Problem, make_inputs
from moebench.store.rows import FAILURES

OOR = triton.runtime.errors.OutOfResources(232448, 196608, "shared memory")

CASES = [
    (OOR, True, "resources"),  # a config the device cannot hold: Triton refuses it at compile time
    (RuntimeError("CUDA error: out of memory"), True, "resources"),  # CUDA's memory ran out
    (triton.CompilationError("src", None, "bad"), True, "compile"),  # a kernel that does not compile
    (RuntimeError("CUDA error: an illegal memory access"), True, "error"),  # CUDA's other failures
    (ValueError("a bug"), False, "error"),  # a programming error: not the GPU's
    (KeyError("x"), False, "error"),
]


@pytest.mark.parametrize("exc, gpu_side, kind", CASES, ids=lambda v: type(v).__name__)
def test_each_exception_is_typed_and_only_the_gpus_are_gpu_side(exc, gpu_side, kind):
    assert is_gpu_side(exc) is gpu_side
    assert classify(exc) == kind and kind in FAILURES


def test_out_of_resources_is_the_compile_time_refusal_and_out_of_memory_the_runtime_one():
    assert out_of_resources(OOR) and not out_of_resources(RuntimeError("CUDA error: out of memory"))
    assert out_of_memory("resources", "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
    assert not out_of_memory("resources", "out of resource: shared memory")
    assert not out_of_memory("compile", "out of memory")  # only a resources failure can be the memory's


@pytest.fixture(scope="module")
def point():
    problem = Problem(MoEShape("m", experts=4, hidden=64, intermediate=32, topk=2), 5, "fp32")
    return PlannedPoint(problem, "torch", None, (None,)), make_inputs(problem, "cpu")


@pytest.mark.parametrize("exc, kind", [(OOR, "resources"), (RuntimeError("CUDA error: launch failed"), "error")])
def test_a_sweep_point_whose_run_fails_on_the_gpu_is_a_typed_error_row(point, exc, kind, monkeypatch):
    planned, inputs = point

    def fail(*a, **k):
        raise exc

    monkeypatch.setattr(sweep, "time_run", fail)
    cpu = Target(torch.device("cpu"), interpreter=True, capability=None)
    row = run_config(planned, get_path("torch"), inputs, None, cpu, None, None)
    assert (row.status, row.failure) == ("error", kind) and row.time_us is None and "\n" not in row.error


def test_a_programming_error_in_a_sweep_point_propagates(point, monkeypatch):
    planned, inputs = point

    def bug(*a, **k):
        raise ZeroDivisionError("a bug, not the GPU's")

    monkeypatch.setattr(sweep, "time_run", bug)
    cpu = Target(torch.device("cpu"), interpreter=True, capability=None)
    with pytest.raises(ZeroDivisionError):
        run_config(planned, get_path("torch"), inputs, None, cpu, None, None)


def test_one_spelling_of_the_timing_method_in_the_package():
    """Rows and meta.json name a run's timing method through ``measure.timer.run_method`` alone: no module
    spells a method of its own."""
    from pathlib import Path

    from moebench.measure.timer import WALLCLOCK, graph_method, run_method

    assert run_method(True) == WALLCLOCK and run_method(False) == graph_method()
    root = Path(__file__).resolve().parent.parent / "moebench"
    spellings = ('"graph replay"', '"interpreter wall clock"', '"cuda-graph replay')  # the literals rows carried
    spelled = [p for p in root.rglob("*.py") if p.name != "timer.py" and any(s in p.read_text() for s in spellings)]
    assert spelled == []
