"""The worker-pool contract: a ``Task`` (a function named "package.module:function", its arguments, a key and a
timeout), the ``Outcome`` a pool gives back for it, the ``Pool`` protocol both pools keep, and ``call_task``,
what a worker does with a task.

A pool runs each task in a process of its own, so that whatever a task does to its process costs one typed
outcome instead of the caller's run: a task that raises is an "error", one whose worker process dies is a
"crash", one past its timeout is a "hang". Tasks, arguments and values are plain picklable data, so they cross
processes and Ray alike.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from moebench.errors import one_line


@dataclass(frozen=True)
class Task:
    """One unit of work, picklable: ``fn`` ("package.module:function") is imported and called in a worker
    as ``fn(*args)``; ``key`` is the caller's id for it; past ``timeout_s`` its worker is killed."""

    fn: str
    args: tuple
    key: object
    timeout_s: float | None = None

    def __post_init__(self):
        if ":" not in self.fn:
            raise ValueError(f"a task's fn is 'package.module:function', not {self.fn!r}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"a task's timeout must be positive, not {self.timeout_s}")


@dataclass(frozen=True)
class Outcome:
    """What became of one task: ``value`` is fn's return value; ``failure`` is None, "error" (fn raised;
    ``error`` holds the one line), "crash" (its worker process died) or "hang" (timed out, worker killed)."""

    key: object
    value: object | None
    failure: str | None
    error: str | None
    worker: int  # which worker ran it: 0 .. workers-1
    seconds: float  # wall time in the worker (for a crash or a hang, since it was handed out)


class Pool(Protocol):
    """Runs tasks on ``workers`` workers; their outcomes as they finish, in any order."""

    workers: int

    def run(self, tasks: Iterable[Task]) -> Iterator[Outcome]: ...

    def close(self) -> None: ...


def call_task(fn: str, args: tuple) -> tuple[object, str | None, float]:
    """In a worker: import and call ``fn(*args)``; its value (None if it raised), the error's one line or
    None, and the seconds it took."""
    start = time.perf_counter()
    try:
        module, _, name = fn.partition(":")
        target = importlib.import_module(module)
        for part in name.split("."):
            target = getattr(target, part)
        value, error = target(*args), None
    except (Exception, SystemExit) as e:  # the task's failure is its outcome; the worker goes on
        value, error = None, one_line(e)
    return value, error, time.perf_counter() - start
