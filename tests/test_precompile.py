"""Compiling a tuned point's candidates in worker processes: each runs, failures come back as one line, and
on a GPU the sweep's process then compiles none of them again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from moebench._interpret import interpreting
from moebench.models import get_model
from moebench.paths.registry import get_path
from moebench.problem import Problem, make_inputs
from moebench.tile import TileConfig
from moebench.tune.handpicked import candidates
from moebench.workers.precompile import WORKER_OVERHEAD_BYTES, Precompiler, workers_for

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


@pytest.mark.parametrize("jobs, weight_gb, free_gb, expected", [
    (12, 1.4, 139, 12),  # DeepSeek-V3@tp8 fp8-block128 on an H200: all twelve fit
    (12, 4.8, 60, 5),  # 30 GB for workers of 5.8 GB each
    (12, 10, 10, 0),  # not one fits in half of what is free: compile in the sweep's process
    (3, 100, None, 3),  # free memory unknown (the interpreter): as asked
])
def test_workers_fit_in_half_the_free_gpu_memory(jobs, weight_gb, free_gb, expected):
    gb = 1 << 30
    free = None if free_gb is None else int(free_gb * gb)
    assert workers_for(jobs, int(weight_gb * gb), free) == expected
    if expected:
        assert expected * (int(weight_gb * gb) + WORKER_OVERHEAD_BYTES) <= (free or float("inf")) / 2


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
