"""Tiny task functions for tests/test_workers.py, in a module that spawned and Ray workers can import."""

from __future__ import annotations

import os
import signal
import time


def double(x):
    return 2 * x


def fail(message: str):
    raise ValueError(message)


def exit_now(code: int):
    os._exit(code)


def kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def pid() -> int:
    return os.getpid()


def getenv(name: str) -> str | None:
    return os.environ.get(name)
