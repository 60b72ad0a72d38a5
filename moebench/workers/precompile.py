"""Compile runs' kernels in worker processes, all at once, ahead of the process that needs them: a tuned
sweep's candidates before they are timed, and ``moebench warmup``'s plan before a server starts.

Each new tile config is a new set of Triton kernels to compile, which takes far longer than checking and
timing it: compiled one after another, they would be most of a tuned sweep's time. A worker first-runs each
config once (``jobs.first_run``), which compiles its kernels into Triton's on-disk cache (``TRITON_CACHE_DIR``,
inherited); the caller's process then finds them there and loads them instead of compiling. The workers run
before a point is timed, never while it is, so no timing shares the GPU with them.

Nothing depends on a worker succeeding: a config a worker could not run (out of shared memory, say) is
compiled and reported by the sweep's process as before. A ``Precompiler`` keeps a compile pool
(``pools.compile_pool``: as many workers as fit in GPU memory) for the runs of one shape and dtype, and
replaces it by a new one when they change, so idle workers never hold another shape's weights.
"""

from __future__ import annotations

from collections.abc import Callable

from moebench.errors import one_line
from moebench.problem import Problem
from moebench.tile import TileConfig
from moebench.workers.local import LocalPool
from moebench.workers.pools import compile_pool
from moebench.workers.task import Task

FIRST_RUN = "moebench.workers.jobs:first_run"


class Precompiler:
    """Up to ``jobs`` worker processes that first-run configs: a pool per shape and dtype, started on its
    first runs."""

    def __init__(self, jobs: int):
        if jobs < 1:
            raise ValueError(f"a precompiler needs at least one worker, not {jobs}")
        self.jobs = jobs
        self.workers = 0  # in the current pool
        self._pool: LocalPool | None = None
        self._weights_of: tuple | None = None  # the (shape, dtype, seed) the current pool's workers hold
        self.broken: str | None = None  # why a pool stopped, if one did; then compile() does nothing

    def compile(self, path_name: str, problem: Problem, configs: list[TileConfig]) -> list[str | None]:
        """Run ``problem`` on path ``path_name`` once per config, each in a worker; per config, None or why
        it could not run. Returns when all have finished."""
        return self.compile_runs(path_name, [(problem, cfg) for cfg in configs], problem)

    def compile_runs(self, path_name: str, runs: list[tuple[Problem, TileConfig]], first: Problem | None = None,
                     on_done: Callable[[int, str | None], None] | None = None) -> list[str | None]:
        """Run each (problem, config) of ``runs`` (problems of one shape, dtype and seed; any M) once in a worker,
        as many at a time as the pool has workers; per run, None or why it could not run (its error's one line,
        or how its worker was lost), and ``on_done(i, error)`` as each ends."""
        problem = first if first is not None else runs[0][0] if runs else None
        if problem is None:
            return []
        if self.broken:
            return [self.broken] * len(runs)
        weights_of = (problem.shape, problem.dtype, problem.seed)
        if weights_of != self._weights_of:
            self.close()  # its workers hold another shape's weights
            self._weights_of = weights_of
            self._pool = compile_pool(self.jobs, problem)
            self.workers = self._pool.workers if self._pool is not None else 0
        if self._pool is None:
            return ["no GPU memory for a compile worker"] * len(runs)
        if any((p.shape, p.dtype, p.seed) != weights_of for p, _ in runs):
            raise ValueError("compile_runs takes problems of one shape, dtype and seed")
        errors: list[str | None] = [None] * len(runs)
        try:
            for outcome in self._pool.run(Task(FIRST_RUN, (path_name, p, cfg), i) for i, (p, cfg) in enumerate(runs)):
                errors[outcome.key] = outcome.value[-1] if outcome.failure is None else outcome.error
                if on_done is not None:
                    on_done(outcome.key, errors[outcome.key])
        except RuntimeError as e:  # workers that die before they start: compile in-process from here on
            self.broken = f"worker pool stopped: {one_line(e)}"
            self.close()
            return [self.broken] * len(runs)
        return errors

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._weights_of, self.workers = None, 0

    def __enter__(self) -> Precompiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
