"""Compiling a tuned point's candidates in worker processes (first runs): each runs, failures come back as one
line, a worker lost costs only its own run, and on a GPU the sweep's process then compiles none of them again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import tune_faulty_jobs as faulty

from moebench._interpret import interpreting
from moebench.models import get_model
from moebench.paths.registry import get_path
from moebench.problem import Problem, make_inputs
from moebench.tile import TileConfig
from moebench.tune.handpicked import candidates
from moebench.workers import jobs, precompile
from moebench.workers.precompile import Precompiler

TINY = get_model("tiny")


def test_workers_run_each_candidate_and_say_which_could_not_run():
    """Two candidates run in a worker (the interpreter on a CPU, the GPU on a GPU); a config the path refuses
    (gemm1_quant_x is for fp8-block128) comes back as its error's one line, not as an exception."""
    problem = Problem(TINY, 1, "fp16")
    good = candidates(problem)[:2]
    bad = replace(good[0], gemm1_quant_x=True, direct_route=True)
    with Precompiler(1) as workers:
        results = workers.compile("triton", problem, [*good, bad])
    assert results[:2] == [None, None]
    assert results[2].startswith("UserError: ") and "gemm1_quant_x" in results[2]
    assert workers.broken is None


def test_a_new_shape_gets_a_new_pool():
    """Points of another dtype (other weights) are run by a pool started for them; the first one's workers,
    which hold the first weights, are gone."""
    fp16, fp32 = Problem(TINY, 1, "fp16"), Problem(TINY, 1, "fp32")
    with Precompiler(1) as workers:
        assert workers.compile("triton", fp16, candidates(fp16)[:1]) == [None]
        first = workers._pool
        assert workers.compile("triton", fp32, candidates(fp32)[:1]) == [None]
        assert workers._pool is not first and workers.workers == 1


def test_a_worker_that_dies_costs_its_own_run_only(monkeypatch):
    """Stand-in first runs (tests/tune_faulty_jobs.py): the run whose worker process exits is that run's
    error line; the runs after it go on in a fresh worker, and the precompiler is not stopped."""
    monkeypatch.setattr(precompile, "FIRST_RUN", "tune_faulty_jobs:first_run")
    problem = Problem(TINY, 1, "fp16")
    configs = [TileConfig(16, 16, 64), TileConfig(faulty.CRASH_M, 16, 64), TileConfig(32, 16, 64)]
    with Precompiler(1) as workers:
        results = workers.compile("triton", problem, configs)
        assert workers.broken is None
    assert results[0] is None and results[2] is None
    assert results[1].startswith("worker process died") and "exit code 3" in results[1]


def test_a_first_run_types_its_failure_as_the_tuner_records_it():
    """In this process: a config the path refuses is an "error" with its one line; a good one ran."""
    problem = Problem(TINY, 1, "fp16")
    good = candidates(problem)[0]
    try:
        assert jobs.first_run("triton", problem, good) == jobs.RAN
        *_, failure, error = jobs.first_run("triton", problem, replace(good, gemm1_quant_x=True, direct_route=True))
    finally:
        jobs.release()
    assert failure == "error" and error.startswith("UserError: ") and "gemm1_quant_x" in error


def test_a_precompiler_needs_a_worker():
    with pytest.raises(ValueError, match="at least one worker"):
        Precompiler(0)


def _compiled(cache: Path) -> int:
    """Kernels in a Triton cache folder: one metadata group per compiled kernel."""
    return len(list(cache.rglob("__grp__*.json")))


@pytest.mark.skipif(interpreting() or not torch.cuda.is_available(), reason="compiles for a GPU")
def test_precompiled_candidates_are_not_compiled_again(tmp_path, monkeypatch):
    """With a fresh Triton cache, workers compile three candidates of a point into it; running them in this
    process then adds no kernel to the cache, while a config the workers did not run adds some (so this
    process does compile into that cache when it has to)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    problem = Problem(TINY, 3, "fp16")
    configs = candidates(problem)[:3]
    with Precompiler(2) as workers:
        assert workers.compile("triton", problem, configs) == [None] * 3
    after_workers = _compiled(tmp_path)
    assert after_workers >= 2 * len(configs)  # two GEMMs per candidate at least

    inputs = make_inputs(problem, "cuda")
    out = torch.empty(problem.M, TINY.hidden, device="cuda", dtype=torch.float16)
    path = get_path("triton")
    for cfg in configs:
        path.prepare(inputs, problem, cfg)(out)
    torch.cuda.synchronize()
    assert _compiled(tmp_path) == after_workers

    unseen = TileConfig(32, 32, 32, 1, 2, 2)  # a shape no candidate has: compiled here, into the same cache
    path.prepare(inputs, problem, unseen)(out)
    torch.cuda.synchronize()
    assert _compiled(tmp_path) > after_workers
