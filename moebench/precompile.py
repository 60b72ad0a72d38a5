"""Compile a tuned point's candidate tile configs in worker processes, all at once, before they are timed.

Each tuning candidate is a new set of Triton kernels to compile: on the H200's machine (16 cores) about a
second of one CPU core per candidate, against about 0.1 s to check and time it, so a tuned sweep spent most of
its time compiling one kernel after another (DeepSeek-V3@tp8 fp8-block128 M=4: 102 of its 288 candidates in
110 s, results/h200-kernels-2c1f5bd). A worker runs each candidate once on the GPU, which compiles its
kernels into Triton's on-disk cache (``TRITON_CACHE_DIR``, inherited); the sweep's process then finds them
there and loads them instead of compiling. The workers run before a point is timed, never while it is, so
no timing shares the GPU with them.

Nothing depends on a worker succeeding: a candidate a worker could not run (out of shared memory, say) is
compiled and reported by the sweep's process as before.

Each worker builds the point's weights itself, one worker at a time (a lock), and gives the temporaries back
to the GPU before the next one starts: twelve workers building DeepSeek-V3@tp8 fp8-block128's weights at once
ran an H200 out of memory.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import nullcontext

from moebench.problem import Problem
from moebench.tile import TileConfig

# Workers by default: one per core but one (the sweep's own), at most 12; each holds a CUDA context and the
# point's weights (DeepSeek-V3@tp8 fp8-block128: 1.4 GB) on the GPU.
MAX_DEFAULT_JOBS = 12


def default_jobs() -> int:
    return max(0, min((os.cpu_count() or 1) - 1, MAX_DEFAULT_JOBS))


class Precompiler:
    """A pool of ``jobs`` worker processes (started on first use) that run a point's candidate configs."""

    def __init__(self, jobs: int):
        if jobs < 1:
            raise ValueError(f"a precompiler needs at least one worker, not {jobs}")
        self.jobs = jobs
        self._pool: ProcessPoolExecutor | None = None
        self.broken: str | None = None  # why the pool stopped, if it did; then compile() does nothing

    def compile(self, path_name: str, problem: Problem, configs: list[TileConfig]) -> list[str | None]:
        """Run ``problem`` on path ``path_name`` once per config, each in a worker; per config, None or why
        it could not run. Returns when all have finished."""
        if self.broken:
            return [self.broken] * len(configs)
        if self._pool is None:
            spawn = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=spawn, initializer=_start_worker,
                                             initargs=(spawn.Lock(),))
        try:
            futures = [self._pool.submit(run_candidate, path_name, problem, cfg) for cfg in configs]
            return [f.result() for f in futures]
        except BrokenProcessPool as e:  # a worker died (killed, or a crash in the driver): compile in-process
            self.broken = f"worker pool stopped: {e}"
            self.close()
            return [self.broken] * len(configs)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Precompiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# A worker's weights, for the last (shape, dtype, seed) it was given, and its inputs for the last M.
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

    from moebench.paths import Target, get_path

    target = Target.current()
    try:
        inputs = _inputs_for(problem, target.device)
        out = torch.empty(problem.M, problem.shape.hidden, device=target.device, dtype=problem.spec.act)
        get_path(path_name).prepare(inputs, problem, config)(out)
        if target.device.type == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # reported, not raised: the sweep's process runs this config again and reports it
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {first}"[:300]
    return None
