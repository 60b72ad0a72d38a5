"""Stand-ins for ``moebench.workers.jobs`` whose outcome the config decides, for tests/test_tune_failures.py.

``first_run`` and ``time_configs`` return ``jobs.Result`` tuples as the real ones do, build no tensors, and
fail on purpose by a marker in the config: a compile error, out of resources, a wrong answer, a worker that
dies, a worker that never answers. Any other config gets a time that depends on its tile and on M. The module
is importable by spawned workers (the tests folder is on the path they inherit).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from moebench.problem import Problem
from moebench.tile import TileConfig

# The markers, one per failure; the tests build their configs from them.
COMPILE_N = 32  # BLOCK_SIZE_N: first_run reports a compile failure
RESOURCES_N = 64  # BLOCK_SIZE_N: first_run reports out of resources
INCORRECT_N = 128  # BLOCK_SIZE_N: time_configs reports a wrong answer
CRASH_M = 256  # BLOCK_SIZE_M: first_run ends its worker process
HANG_K = 256  # BLOCK_SIZE_K: first_run sleeps far past any test's timeout
TIME_CRASH_GROUP = 64  # GROUP_SIZE_M: time_configs ends its worker process, at M = TIME_CRASH_AT only
TIME_CRASH_AT = 4
INCORRECT_ERR = 0.5


def warm() -> None:
    """A worker initializer: import what unpickling a task needs (torch, through ``Problem``) before the worker
    says it is ready, so a task's timeout measures the task, not the import."""
    import moebench.problem  # noqa: F401


def time_us(problem: Problem, cfg: TileConfig) -> float:
    """The time a good config gets: bigger tiles are faster, more tokens slower."""
    return problem.M * 1e6 / (cfg.BLOCK_SIZE_M * cfg.BLOCK_SIZE_N * cfg.BLOCK_SIZE_K)


def first_run(path_name: str, problem: Problem, cfg: TileConfig) -> tuple:
    if cfg.BLOCK_SIZE_M == CRASH_M:
        os._exit(3)
    if cfg.BLOCK_SIZE_K == HANG_K:
        time.sleep(600)
    if cfg.BLOCK_SIZE_N == COMPILE_N:
        return (None,) * 5 + ("compile", "CompilationError: at 1:0: made up")
    if cfg.BLOCK_SIZE_N == RESOURCES_N:
        return (None,) * 5 + ("resources", "OutOfResources: shared memory, made up")
    return (None,) * 7


def time_configs(path_name: str, problem: Problem, configs: Sequence[TileConfig], phase: str) -> list[tuple]:
    results = []
    for cfg in configs:
        if cfg.GROUP_SIZE_M == TIME_CRASH_GROUP and problem.M == TIME_CRASH_AT:
            os._exit(3)
        if cfg.BLOCK_SIZE_N == INCORRECT_N:
            results.append((None, None, None, None, INCORRECT_ERR, "incorrect", "rel. error 0.5 > 0.01, made up"))
            continue
        t = time_us(problem, cfg)
        results.append((t, 0.9 * t, 1.1 * t, 10, 1e-4, None, None))
    return results
