"""``RayPool``: tasks (``workers.task``) as Ray remote calls, the worker pool of ``--ray [ADDRESS]``.

Each task is one remote call of ``task.call_task`` with ``max_retries=0`` (a config that killed its worker
would only kill another), never more at once than the cluster has GPUs for, so that a task's timeout
counts its own run and not its wait in Ray's queue. A dead worker is a "crash"; a task past its timeout is
cancelled with force (its worker process killed), a "hang". Ray is imported when a pool is made: it is an
optional extra.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from moebench.errors import UserError, one_line
from moebench.workers.task import Outcome, Task, call_task


def import_ray():
    """The ray module, or a UserError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError("ray is not installed: pip install 'moebench[ray]'") from None
    return ray


class RayPool:
    """Tasks as Ray remote calls on the cluster at ``address`` (None: Ray's default, RAY_ADDRESS or a new
    local instance; "local": a new local instance), each given ``gpus_per_task`` GPUs (None: 1 where the
    cluster has GPUs, else 0). ``env`` is set in the tasks' workers; ``init_kwargs`` go to ``ray.init``
    when this pool starts Ray. Workers need moebench importable: installed on every node of a cluster."""

    def __init__(self, address: str | None = None, gpus_per_task: float | None = None,
                 env: dict[str, str] | None = None, **init_kwargs):
        ray = import_ray()
        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            ray.init(address=address, **init_kwargs)
        resources = ray.cluster_resources()
        gpus = resources.get("GPU", 0.0)
        if gpus_per_task is None:
            gpus_per_task = 1.0 if gpus > 0 else 0.0
        if gpus_per_task > 0:
            if gpus < gpus_per_task:
                self.close()
                raise UserError(f"the Ray cluster has {gpus:g} GPUs, and a task asks for {gpus_per_task:g}")
            self.workers = int(gpus / gpus_per_task + 1e-9)
        else:
            self.workers = max(1, int(resources.get("CPU", 1.0)))
        options = {"num_gpus": gpus_per_task, "max_retries": 0}
        if env:
            options["runtime_env"] = {"env_vars": {k: str(v) for k, v in env.items()}}
        self._call = ray.remote(call_task).options(**options)

    def run(self, tasks: Iterable[Task]) -> Iterator[Outcome]:
        """Run ``tasks``, no more at once than ``workers``; their outcomes as they finish. ``worker`` in an
        Outcome is the slot among those ``workers`` (Ray picks the process). A task's timeout counts from
        its submission, which includes Ray starting a worker process for it."""
        ray = self._ray
        pending, more = iter(tasks), True
        flights: dict = {}  # ObjectRef -> (slot, task, submitted at)
        free = list(range(self.workers))
        try:
            while True:
                while more and free:
                    task = next(pending, None)
                    if task is None:
                        more = False
                        break
                    flights[self._call.remote(task.fn, task.args)] = (free.pop(0), task, time.monotonic())
                if not flights:
                    return
                deadlines = [t0 + t.timeout_s for _, t, t0 in flights.values() if t.timeout_s is not None]
                wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
                done, _ = ray.wait(list(flights), num_returns=1, timeout=wait_s)
                for ref in done:
                    slot, task, t0 = flights.pop(ref)
                    free.append(slot)
                    yield self._outcome(ref, slot, task, t0)
                now = time.monotonic()
                for ref, (slot, task, t0) in list(flights.items()):
                    if task.timeout_s is not None and now >= t0 + task.timeout_s:
                        ray.cancel(ref, force=True)  # kills its worker process
                        del flights[ref]
                        free.append(slot)
                        error = f"no result after {task.timeout_s:g} s: worker killed"
                        yield Outcome(task.key, None, "hang", error, slot, now - t0)
        finally:
            for ref in flights:  # the caller stopped early
                ray.cancel(ref, force=True)

    def _outcome(self, ref, slot: int, task: Task, t0: float) -> Outcome:
        errors = self._ray.exceptions
        try:
            value, error, seconds = self._ray.get(ref)
        except (errors.WorkerCrashedError, errors.NodeDiedError, errors.OutOfMemoryError) as e:
            return Outcome(task.key, None, "crash", one_line(e), slot, time.monotonic() - t0)
        except errors.RayError as e:  # raised past call_task (a BaseException), or a result Ray could not keep
            return Outcome(task.key, None, "error", one_line(e), slot, time.monotonic() - t0)
        return Outcome(task.key, value, "error" if error else None, error, slot, seconds)

    def close(self) -> None:
        """Shut Ray down if this pool started it."""
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
        self._owns = False

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
