"""``LocalPool``: tasks (``workers.task``) run in worker processes on this machine, one GPU each or the CPU.

A candidate config is compiled and first run in a worker, never in the caller's process, so that whatever it
does to its process (a compile that never ends, a kernel that faults the GPU and takes its CUDA context down,
a segfault in the driver) costs one typed outcome instead of the run. The pool keeps one ``multiprocessing``
process per worker (spawn: a CUDA context does not survive a fork) with a pipe to each, and hands a worker its
next task only when it is idle, so a dead worker loses only the task it was running; it replaces a lost worker
with a fresh process and goes on with the other tasks. Outcomes come back as they finish, in any order.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import time
import weakref
from collections.abc import Iterable, Iterator
from multiprocessing import connection, get_context

from moebench.errors import one_line
from moebench.workers.task import Outcome, Task, call_task

# A killed worker gets SIGTERM, then SIGKILL if it is still there after this many seconds.
KILL_GRACE_S = 1.0
# Seconds a closing pool waits for its idle workers to leave before it kills them.
CLOSE_WAIT_S = 5.0
# Workers that die before they are ready (in a row, across the pool) before a run stops: a worker that
# cannot even start (moebench not importable, its initializer failing) would otherwise be restarted forever.
MAX_START_FAILURES = 3


def _serve(conn, initializer: str | None, initargs: tuple) -> None:
    """A local worker's life: say it is ready (or why its initializer failed), then run the tasks it is sent
    until it is sent None or the pool's end of the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's: its pool stops the workers
    if initializer is not None:
        _, error, _ = call_task(initializer, initargs)
        if error is not None:
            conn.send(("failed", error))
            return
    conn.send(("ready",))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the pool's process is gone
            return
        if task is None:
            return
        value, error, seconds = call_task(*task)
        try:
            conn.send(("done", value, error, seconds))
        except (EOFError, OSError):
            return
        except Exception as e:  # a value that cannot be pickled
            conn.send(("done", None, f"cannot send the result back: {one_line(e)}", seconds))


@contextlib.contextmanager
def _environ(extra: dict[str, str]):
    """``os.environ`` with ``extra`` set, put back after: a spawned process takes its environment from it."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def visible_device(device: int) -> str:
    """CUDA_VISIBLE_DEVICES for a worker on ``device``, an index among the GPUs this process sees (which
    the parent's own CUDA_VISIBLE_DEVICES may already narrow and renumber)."""
    seen = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not seen:
        return str(device)
    if not 0 <= device < len(seen):
        raise ValueError(f"GPU {device} is not among CUDA_VISIBLE_DEVICES={','.join(seen)}")
    return seen[device]


class _Worker:
    """One worker process, the pool's end of its pipe, and the task it runs (None when idle)."""

    def __init__(self, index: int, process, conn):
        self.index, self.process, self.conn = index, process, conn
        self.ready = False
        self.task: Task | None = None
        self.started = 0.0

    def deadline(self) -> float | None:
        if self.task is None or self.task.timeout_s is None:
            return None
        return self.started + self.task.timeout_s

    def stop(self) -> None:
        """Kill the process (SIGTERM, then SIGKILL after a grace) and close the pipe."""
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(KILL_GRACE_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(KILL_GRACE_S)
        self.conn.close()


def _stop_all(slots: list[_Worker | None]) -> None:
    """Ask idle workers to leave, wait a little, kill whatever is left."""
    slots = [w for w in slots if w is not None]
    for w in slots:
        if w.task is None and not w.conn.closed:
            with contextlib.suppress(OSError):
                w.conn.send(None)
    end = time.monotonic() + CLOSE_WAIT_S
    for w in slots:
        if w.task is None:
            w.process.join(max(0.0, end - time.monotonic()))
        w.stop()


class LocalPool:
    """``workers`` spawned processes on this machine; worker i sees only GPU ``devices[i % len(devices)]``
    (None: the devices are left as they are, as on a CPU-only machine). Workers inherit this process's
    environment plus ``env``; ``initializer`` ("package.module:function"), if given, runs once in each
    worker as ``initializer(*initargs)`` before its first task."""

    def __init__(self, workers: int, devices: list[int] | None = None, env: dict[str, str] | None = None,
                 initializer: str | None = None, initargs: tuple = ()):
        if workers < 1:
            raise ValueError(f"a pool needs at least one worker, not {workers}")
        if devices is not None and not devices:
            raise ValueError("devices is None (leave them as they are) or names at least one GPU")
        self.workers = workers
        self._devices = devices
        self._env = {k: str(v) for k, v in (env or {}).items()}
        self._initializer, self._initargs = initializer, initargs
        self._context = get_context("spawn")
        self._start_failures = 0
        self._running = False
        self._slots: list[_Worker | None] = [self._start(i) for i in range(workers)]  # None: to start
        self._finalizer = weakref.finalize(self, _stop_all, self._slots)
        _open_pools.add(self)

    def _start(self, index: int) -> _Worker:
        env = dict(self._env)
        if self._devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_device(self._devices[index % len(self._devices)])
        ours, theirs = self._context.Pipe()
        process = self._context.Process(target=_serve, args=(theirs, self._initializer, self._initargs),
                                        name=f"moebench-worker-{index}")
        with _environ(env):  # set before the worker starts, so before it imports torch
            process.start()
        theirs.close()
        return _Worker(index, process, ours)

    def _replace(self, w: _Worker) -> None:
        w.stop()
        self._slots[w.index] = self._start(w.index)

    def _lost(self, w: _Worker, failure: str) -> Outcome:
        """The outcome of ``w``'s task when ``w`` died ("crash") or ran past its timeout ("hang"); ``w`` is
        replaced by a fresh worker."""
        task, seconds = w.task, time.monotonic() - w.started
        if failure == "hang":
            error = f"no result after {task.timeout_s:g} s: worker killed"
        else:
            w.process.join(KILL_GRACE_S)
            error = f"worker process died: {_exit_reason(w.process.exitcode)}"
        w.task = None
        self._replace(w)
        return Outcome(task.key, None, failure, error, w.index, seconds)

    def _not_ready(self, w: _Worker, message: tuple | None) -> None:
        """``w`` died or failed before it was ready: start another, or stop after too many in a row."""
        if message is not None and message[0] == "failed":
            raise RuntimeError(f"worker initializer {self._initializer} failed: {message[1]}")
        self._start_failures += 1
        w.process.join(KILL_GRACE_S)
        reason = _exit_reason(w.process.exitcode)
        if self._start_failures >= MAX_START_FAILURES:
            raise RuntimeError(f"worker processes keep dying before they start (the last: {reason}); "
                               "their error output says why")
        self._replace(w)

    def _hand_out(self, w: _Worker, task: Task) -> Outcome | None:
        """Send ``task`` to the idle ``w``; an Outcome if ``w`` turns out to be dead."""
        w.task, w.started = task, time.monotonic()
        try:
            w.conn.send((task.fn, task.args))
        except (BrokenPipeError, ConnectionResetError):
            return self._lost(w, "crash")
        return None

    def run(self, tasks: Iterable[Task]) -> Iterator[Outcome]:
        """Run ``tasks``, each on the next idle worker; their outcomes as they finish. Tasks are taken from
        ``tasks`` one at a time, as workers come free. A caller that stops early loses the running tasks:
        their workers are stopped and replaced."""
        if self._running:
            raise RuntimeError("this pool is already running tasks")
        if not self._finalizer.alive:
            raise RuntimeError("this pool is closed")
        self._running = True
        pending, more = iter(tasks), True
        self._slots[:] = [w or self._start(i) for i, w in enumerate(self._slots)]  # those the last run stopped
        try:
            while True:
                for w in list(self._slots):
                    if more and w.ready and w.task is None:
                        if not w.process.is_alive():  # died while idle: no task of its to report
                            self._replace(w)
                            continue
                        task = next(pending, None)
                        if task is None:
                            more = False
                        elif (lost := self._hand_out(w, task)) is not None:
                            yield lost
                busy = [w for w in self._slots if w.task is not None]
                if not busy and not more:
                    return
                yield from self._collect(busy)
        finally:
            self._running = False
            for i, w in enumerate(self._slots):
                if w is not None and w.task is not None:  # the caller stopped early: the result would come
                    w.stop()  # to the next run; a new worker starts with that run
                    self._slots[i] = None

    def _collect(self, busy: list[_Worker]) -> Iterator[Outcome]:
        """Wait for one event (a result, a worker ready, a worker dead, a timeout) and deal with it all."""
        live = [w for w in self._slots if w.task is not None or not w.ready]
        deadlines = [d for w in busy if (d := w.deadline()) is not None]
        wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        ready = set(connection.wait([w.conn for w in live] + [w.process.sentinel for w in live], wait_s))
        for w in live:
            message = None
            if w.conn in ready:
                try:
                    message = w.conn.recv()
                except (EOFError, OSError):  # died part-way through a message
                    pass
                except Exception as e:  # a value that does not unpickle here
                    message = ("done", None, f"cannot read the result: {one_line(e)}", 0.0)
            if message is not None and message[0] == "ready":
                w.ready, self._start_failures = True, 0
            elif message is not None and message[0] == "done":
                _, value, error, seconds = message
                task, w.task = w.task, None
                yield Outcome(task.key, value, "error" if error else None, error, w.index, seconds)
            elif w.conn in ready or w.process.sentinel in ready:  # dead (or failed before it was ready)
                if w.ready:
                    yield self._lost(w, "crash")
                else:
                    self._not_ready(w, message)
            elif (d := w.deadline()) is not None and time.monotonic() >= d:
                yield self._lost(w, "hang")

    def close(self) -> None:
        """Stop the workers (idle ones leave, busy ones are killed); a second close does nothing."""
        self._finalizer()

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Pools left open stop at exit, before multiprocessing's own exit hook joins their worker processes (which
# would wait forever: the workers wait for tasks). Hooks run last registered first; this one is registered
# after multiprocessing's, which importing multiprocessing.connection registers.
_open_pools: weakref.WeakSet[LocalPool] = weakref.WeakSet()
atexit.register(lambda: [pool.close() for pool in list(_open_pools)])


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"

