"""The one place worker pools are built: the timing pool of ``--gpus N`` / ``--ray [ADDRESS]``, the compile pool of
first runs (as many workers as fit in GPU memory), and ``Pools``, the pair of them that every bench measures on
(``tune``, ``retime``, ``--merge-with``, ``fit-time``).

Timing wants the GPU to itself: one worker per GPU. First runs (compiling a config's kernels into Triton's
on-disk cache) are mostly CPU work, so many workers share a GPU; each holds a CUDA context and one shape's
weights there, so ``workers_for`` starts as many as fit in half the free GPU memory, the other half left to
the process that times. Workers build their weights one at a time (a lock, ``jobs.share_builds``): many
workers building large weights at once can run the GPU out of memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from multiprocessing import get_context

from moebench.errors import UserError
from moebench.problem import Problem
from moebench.workers.bench import Kept, PoolBench, Timed
from moebench.workers.local import LocalPool
from moebench.workers.task import Pool

JOBS = "moebench.workers.jobs"  # the module whose first_run and time_configs the workers run

# Compile workers by default: one per core but one (the caller's own), at most 15.
MAX_DEFAULT_JOBS = 15
# GPU memory a worker takes besides the weights: its CUDA context, the point's inputs and the layer's buffers.
WORKER_OVERHEAD_BYTES = 1 << 30


def local_gpus() -> int:
    """The CUDA GPUs this process sees; counting them creates no CUDA context."""
    import torch

    return torch.cuda.device_count()


def make_pool(gpus: int | None = None, ray_address: str | bool | None = None, *,
              env: dict[str, str] | None = None) -> Pool:
    """The pool for ``--gpus N`` (default: one worker per local GPU, one on a CPU-only machine) or
    ``--ray [ADDRESS]`` (``ray_address`` True: Ray's default address; a string: that cluster, "local" a
    new local instance; None or False: local workers)."""
    check_pool_choice(gpus, ray_address)
    if ray_address not in (None, False):
        from moebench.workers.ray import RayPool

        return RayPool(None if ray_address is True else ray_address, env=env)
    have = local_gpus()
    if have == 0:
        return LocalPool(1, None, env)  # the CPU: a worker runs the Triton interpreter
    n = gpus or have
    return LocalPool(n, list(range(n)), env)


def check_pool_choice(gpus: int | None = None, ray_address: str | bool | None = None) -> None:
    """UserError where ``make_pool(gpus, ray_address)`` cannot be made here; starts nothing, so a command checks
    it before it creates its run folder."""
    if ray_address not in (None, False):
        if gpus is not None:
            raise UserError("--gpus and --ray: choose one (on Ray, each task takes one of the cluster's GPUs)")
        return
    if gpus is not None and gpus < 1:
        raise UserError(f"--gpus {gpus}: at least 1")
    have = local_gpus()
    if have == 0 and gpus not in (None, 1):
        raise UserError(f"--gpus {gpus}: this machine has no CUDA GPU (one worker runs the Triton interpreter)")
    if have and gpus is not None and gpus > have:
        raise UserError(f"--gpus {gpus}: this machine has {have} CUDA GPU{'s' if have > 1 else ''}")


def default_jobs() -> int:
    """Compile workers when ``--compile-jobs`` is not given."""
    return max(0, min((os.cpu_count() or 1) - 1, MAX_DEFAULT_JOBS))


def workers_for(jobs: int, weight_bytes: int, free_bytes: int | None) -> int:
    """How many of ``jobs`` workers to start for weights of ``weight_bytes``: as many as fit in half of
    ``free_bytes`` of GPU memory (all of them where that is not known: the interpreter, on the CPU)."""
    if free_bytes is None:
        return jobs
    return max(0, min(jobs, free_bytes // 2 // (weight_bytes + WORKER_OVERHEAD_BYTES)))


def weight_bytes(problem: Problem) -> int:
    """The expert weights of ``problem``: w13 [E, 2I, hidden] and w2 [E, hidden, I] (scales left out)."""
    s = problem.shape
    return 3 * s.experts * s.hidden * s.intermediate * problem.spec.weight_bytes


def free_gpu_bytes() -> int | None:
    """Free memory of this process's GPU; None without one."""
    import torch

    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None


def compile_pool(jobs: int, problem: Problem, gpus: int | None = None) -> LocalPool | None:
    """Up to ``jobs`` workers for first runs of ``problem``'s shape and dtype, as many as fit (``workers_for``)
    on ``gpus`` GPUs, spread over them (None: the GPU this process uses, devices left as they are); None
    where not one fits."""
    free = free_gpu_bytes()
    n = workers_for(jobs, weight_bytes(problem), None if free is None else free * (gpus or 1))
    if n < 1:
        return None
    lock = get_context("spawn").Lock()
    return LocalPool(n, list(range(gpus)) if gpus else None, initializer="moebench.workers.jobs:share_builds",
                     initargs=(lock,))


class Pools:
    """The worker pools benches measure on, started once for many benches: one timing worker per GPU (or the
    tasks of a Ray cluster) and, on a local GPU, compile workers (as many as fit the largest weights asked for
    so far, the pool made again when larger ones come); on the interpreter and on Ray one pool does both.
    ``jobs``: the module whose functions the workers run (tests give a stand-in)."""

    def __init__(self, gpus: int | None = None, compile_jobs: int | None = None, ray: str | bool | None = None,
                 jobs: str = JOBS):
        self.gpus, self.compile_jobs, self.ray, self.jobs = gpus, compile_jobs, ray, jobs
        self._time: Pool | None = None
        self._compile: Pool | None = None
        self._sized_for = -1  # the weight bytes the compile pool was sized for

    def bench(self, path: str, problems: Mapping[int, Problem], on_result: Callable[[Timed], None],
              on_progress: Callable[[str, int, int], None] | None = None, kept: Kept | None = None) -> PoolBench:
        """A ``PoolBench`` of ``path`` at ``problems`` on these pools (``kept``: a stopped run's answers)."""
        from moebench._interpret import interpreting

        if self._time is None:
            self._time = make_pool(self.gpus, self.ray)
        problem = problems[min(problems)]
        jobs = default_jobs() if self.compile_jobs is None else self.compile_jobs
        local = self.ray in (None, False) and not interpreting()
        if local and jobs and weight_bytes(problem) > self._sized_for:
            if self._compile is not None:
                self._compile.close()
            self._compile = compile_pool(jobs, problem, self.gpus or local_gpus())
            self._sized_for = weight_bytes(problem)
        return PoolBench(path, problems, self._compile or self._time, self._time, on_result, kept,
                         on_progress=on_progress, jobs=self.jobs)

    def close(self) -> None:
        for pool in (self._compile, self._time):
            if pool is not None:
                pool.close()
        self._time = self._compile = None

    def __enter__(self) -> Pools:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
