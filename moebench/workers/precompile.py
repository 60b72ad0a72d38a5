"""Compile a tuned point's candidate tile configs in worker processes, all at once, before they are timed.

Each tuning candidate is a new set of Triton kernels to compile, which takes far longer than checking and
timing it: compiled one after another, they would be most of a tuned sweep's time. A worker runs each
candidate once on the GPU, which compiles its kernels into Triton's on-disk cache (``TRITON_CACHE_DIR``,
inherited); the sweep's process then finds them there and loads them instead of compiling. The workers run
before a point is timed, never while it is, so no timing shares the GPU with them.

Nothing depends on a worker succeeding: a candidate a worker could not run (out of shared memory, say) is
compiled and reported by the sweep's process as before.

GPU memory: each worker builds the point's weights itself, one worker at a time (a lock: many workers
building large weights at once can run the GPU out of memory), and gives the temporaries back to the GPU
before the next one starts. A pool serves the points of one shape and dtype, and is replaced by a new one
when they change, so idle workers never hold another shape's weights; it has as many workers as fit in half
the GPU's free memory (``workers_for``), the other half left to the sweep's process.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import nullcontext

from moebench.errors import one_line
from moebench.problem import Problem
from moebench.tile import TileConfig

# Workers by default: one per core but one (the sweep's own), at most 12; each holds a CUDA context and the
# point's weights on the GPU.
MAX_DEFAULT_JOBS = 12
# GPU memory a worker takes besides the weights: its CUDA context, the point's inputs and the layer's buffers.
WORKER_OVERHEAD_BYTES = 1 << 30


def default_jobs() -> int:
    return max(0, min((os.cpu_count() or 1) - 1, MAX_DEFAULT_JOBS))


def workers_for(jobs: int, weight_bytes: int, free_bytes: int | None) -> int:
    """How many of ``jobs`` workers to start for weights of ``weight_bytes``: as many as fit in half of
    ``free_bytes`` of GPU memory (all of them where that is not known: the interpreter, on the CPU)."""
    if free_bytes is None:
        return jobs
    return max(0, min(jobs, free_bytes // 2 // (weight_bytes + WORKER_OVERHEAD_BYTES)))


def _weight_bytes(problem: Problem) -> int:
    """The expert weights of ``problem``: w13 [E, 2I, hidden] and w2 [E, hidden, I] (scales left out)."""
    s = problem.shape
    return 3 * s.experts * s.hidden * s.intermediate * problem.spec.weight_bytes


def _free_gpu_bytes() -> int | None:
    import torch

    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None


class Precompiler:
    """Up to ``jobs`` worker processes that run a point's candidate configs: a pool per shape and dtype,
    started on its first point."""

    def __init__(self, jobs: int):
        if jobs < 1:
            raise ValueError(f"a precompiler needs at least one worker, not {jobs}")
        self.jobs = jobs
        self.workers = 0  # in the current pool
        self._pool: ProcessPoolExecutor | None = None
        self._weights_of: tuple | None = None  # the (shape, dtype, seed) the current pool's workers hold
        self.broken: str | None = None  # why a pool stopped, if one did; then compile() does nothing

    def compile(self, path_name: str, problem: Problem, configs: list[TileConfig]) -> list[str | None]:
        """Run ``problem`` on path ``path_name`` once per config, each in a worker; per config, None or why
        it could not run. Returns when all have finished."""
        return self.compile_runs(path_name, [(problem, cfg) for cfg in configs], problem)

    def compile_runs(self, path_name: str, runs: list[tuple[Problem, TileConfig]], first: Problem | None = None,
                     on_done: Callable[[int, str | None], None] | None = None) -> list[str | None]:
        """Run each (problem, config) of ``runs`` (problems of one shape, dtype and seed; any M) once in a worker,
        all submitted at once; per run, None or why it could not run, and ``on_done(i, error)`` as each ends."""
        problem = first if first is not None else runs[0][0] if runs else None
        if problem is None:
            return []
        if self.broken:
            return [self.broken] * len(runs)
        weights_of = (problem.shape, problem.dtype, problem.seed)
        if weights_of != self._weights_of:
            self.close()  # its workers hold another shape's weights
            self._weights_of = weights_of
            self.workers = workers_for(self.jobs, _weight_bytes(problem), _free_gpu_bytes())
            if self.workers:
                spawn = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(self.workers, mp_context=spawn, initializer=_start_worker,
                                                 initargs=(spawn.Lock(),))
        if self._pool is None:
            return ["no GPU memory for a compile worker"] * len(runs)
        if any((p.shape, p.dtype, p.seed) != weights_of for p, _ in runs):
            raise ValueError("compile_runs takes problems of one shape, dtype and seed")
        try:
            futures = {self._pool.submit(run_candidate, path_name, p, cfg): i for i, (p, cfg) in enumerate(runs)}
            errors: list[str | None] = [None] * len(runs)
            for f in as_completed(futures):
                errors[futures[f]] = f.result()
                if on_done is not None:
                    on_done(futures[f], errors[futures[f]])
            return errors
        except BrokenProcessPool as e:  # a worker died (killed, or a crash in the driver): compile in-process
            self.broken = f"worker pool stopped: {e}"
            self.close()
            return [self.broken] * len(runs)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
        self._weights_of, self.workers = None, 0

    def __enter__(self) -> Precompiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# A worker's weights (its pool serves one shape and dtype) and its inputs for the last M it was given.
_weights: dict[tuple, object] = {}
_inputs: dict[tuple, object] = {}
_building = nullcontext()  # in a pool, the pool's lock: one worker builds weights at a time


def _start_worker(lock) -> None:
    global _building
    _building = lock


def _inputs_for(problem: Problem, device):
    import torch

    from moebench.problem import make_inputs, make_weights

    key = (problem.shape, problem.dtype, problem.seed)
    if key not in _weights:
        _weights.clear()  # one shape's weights at a time
        _inputs.clear()
        with _building:
            torch.cuda.empty_cache()
            _weights[key] = make_weights(problem.shape, problem.dtype, problem.seed, device)
            torch.cuda.empty_cache()  # the build's temporaries, back to the GPU for the next worker's build
    if (*key, problem.M) not in _inputs:
        _inputs.clear()
        _inputs[(*key, problem.M)] = make_inputs(problem, device, _weights[key], draw=0)
    return _inputs[(*key, problem.M)]


def run_candidate(path_name: str, problem: Problem, config: TileConfig) -> str | None:
    """In a worker: run ``problem`` once on path ``path_name`` with ``config`` on this machine's device
    (compiling its kernels), its output discarded. None, or the error that stopped it (one line)."""
    import torch

    from moebench.paths.base import Target
    from moebench.paths.registry import get_path

    target = Target.current()
    try:
        inputs = _inputs_for(problem, target.device)
        out = torch.empty(problem.M, problem.shape.hidden, device=target.device, dtype=problem.spec.act)
        get_path(path_name).prepare(inputs, problem, config)(out)
        if target.device.type == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # reported, not raised: the sweep's process runs this config again and reports it
        return one_line(e)
    return None
