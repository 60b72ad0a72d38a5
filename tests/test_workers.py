"""Worker pools: every task comes back as an outcome with its key, whatever its worker did (returned, raised,
died, hung), and the pool goes on. CPU only: the tasks are tiny functions in tests/workers_tasks.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import workers_tasks

from moebench.errors import UserError
from moebench.workers import pools
from moebench.workers.local import LocalPool
from moebench.workers.pools import WORKER_OVERHEAD_BYTES, make_pool, workers_for
from moebench.workers.task import Task

TESTS = Path(__file__).resolve().parent


def task(name: str, *args, key=None, timeout_s=None) -> Task:
    return Task(f"workers_tasks:{name}", args, key if key is not None else name, timeout_s)


def by_key(outcomes) -> dict:
    found = {}
    for o in outcomes:
        assert o.key not in found, f"two outcomes for {o.key!r}"
        found[o.key] = o
    return found


def test_the_spawned_workers_can_import_the_task_module():
    """The precondition of every test here: the task module is on the path spawned processes inherit."""
    assert str(TESTS) in sys.path and workers_tasks.__name__ == "workers_tasks"


def test_each_value_comes_back_with_its_key():
    with LocalPool(2) as pool:
        got = by_key(pool.run(task("double", k, key=k) for k in range(6)))
    assert sorted(got) == list(range(6))
    for k, o in got.items():
        assert (o.value, o.failure, o.error) == (2 * k, None, None)
        assert o.worker in (0, 1) and o.seconds >= 0


def test_an_exception_is_an_error_outcome_and_the_pool_goes_on():
    with LocalPool(1) as pool:
        got = by_key(pool.run([task("fail", "no such tile"), task("double", 4)]))
    assert got["fail"].failure == "error" and got["fail"].value is None
    assert got["fail"].error == "ValueError: no such tile"
    assert (got["double"].value, got["double"].failure) == (8, None)


@pytest.mark.parametrize("death", [
    ("exit_now", 3),  # os._exit: the process leaves without a word
    ("kill_self",),  # SIGKILL, as the kernel's OOM killer or a user would
])
def test_a_dead_worker_is_a_crash_for_its_task_only(death):
    """On one worker: the task before the death and the one after it both run, the one after in a fresh
    process."""
    with LocalPool(1) as pool:
        got = by_key(pool.run([task("pid", key="before"), task(*death, key="dies"), task("pid", key="after")]))
    assert got["dies"].failure == "crash" and "worker process died" in got["dies"].error
    assert got["before"].failure is None and got["after"].failure is None
    assert got["after"].value != got["before"].value  # the dead worker was replaced by a new process


def test_a_worker_killed_while_idle_costs_no_task():
    with LocalPool(1) as pool:
        (first,) = pool.run([task("pid")])
        os.kill(first.value, signal.SIGKILL)
        time.sleep(0.5)  # SIGKILL lands at once: the worker is dead before the next task is handed out
        (second,) = pool.run([task("pid")])
    assert second.failure is None and second.value != first.value


def test_a_task_past_its_timeout_is_a_hang_and_the_pool_goes_on():
    start = time.monotonic()
    with LocalPool(1) as pool:
        got = by_key(pool.run([task("nap", 60.0, timeout_s=0.5), task("double", 5)]))
    assert got["nap"].failure == "hang" and got["nap"].value is None
    assert 0.5 <= got["nap"].seconds < 5
    assert (got["double"].value, got["double"].failure) == (10, None)
    assert time.monotonic() - start < 15  # the sleeper was killed, not waited for


def warm(pool: LocalPool) -> None:
    """Run short naps until every worker has run one: all of them started and ready for the next tasks."""
    seen: set[int] = set()
    for _ in range(50):
        seen |= {o.worker for o in pool.run(task("nap", 0.2, key=k) for k in range(pool.workers))}
        if seen == set(range(pool.workers)):
            return
    raise AssertionError(f"only workers {sorted(seen)} of {pool.workers} started")


def test_two_workers_run_two_naps_in_about_half_the_serial_time():
    with LocalPool(2) as pool:
        warm(pool)
        start = time.monotonic()
        got = by_key(pool.run([task("nap", 1.0, key=0), task("nap", 1.0, key=1)]))
        elapsed = time.monotonic() - start
    assert [o.failure for o in got.values()] == [None, None]
    assert {o.worker for o in got.values()} == {0, 1}
    assert elapsed < 1.7, f"2 naps of 1 s on 2 workers took {elapsed:.2f} s"


def test_workers_see_their_own_gpu_and_the_parents_environment(monkeypatch):
    """Worker i gets the i-th of the GPUs the parent sees (renumbered by the parent's CUDA_VISIBLE_DEVICES),
    the pool's extra variables, and the parent's own (NCCL_* and the like)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    want = {"CUDA_VISIBLE_DEVICES": ["5", "7"], "NCCL_DEBUG": ["WARN"] * 2, "TRITON_CACHE_DIR": ["/tmp/c"] * 2}
    with LocalPool(2, devices=[0, 1], env={"TRITON_CACHE_DIR": "/tmp/c"}) as pool:
        warm(pool)  # then the first two tasks go one to each worker
        got = list(pool.run(task("getenv", name, key=(name, i)) for name in want for i in range(2)))
    assert len(got) == 6
    assert {o.worker for o in got if o.key[0] == "CUDA_VISIBLE_DEVICES"} == {0, 1}
    for o in got:
        assert o.value == want[o.key[0]][o.worker], o


def test_a_caller_that_stops_early_gets_no_stale_outcome_later():
    with LocalPool(2) as pool:
        for _ in pool.run([task("double", 1, key="first"), task("nap", 0.5, key="abandoned")]):
            break
        got = by_key(pool.run([task("double", 6, key="next")]))
    assert list(got) == ["next"] and got["next"].value == 12


def test_a_worker_that_cannot_start_stops_the_run():
    """A failing initializer is a programming error: the run stops instead of restarting workers forever."""
    with LocalPool(1, initializer="workers_tasks:fail", initargs=("no GPU here",)) as pool:
        with pytest.raises(RuntimeError, match="no GPU here"):
            list(pool.run([task("double", 1)]))


def test_make_pool_checks_its_flags(monkeypatch):
    with pytest.raises(UserError, match="at least 1"):
        make_pool(gpus=0)
    with pytest.raises(UserError, match="choose one"):
        make_pool(gpus=2, ray_address="local")
    monkeypatch.setattr(pools, "local_gpus", lambda: 2)
    with pytest.raises(UserError, match="this machine has 2 CUDA GPUs"):
        make_pool(gpus=3)
    monkeypatch.setattr(pools, "local_gpus", lambda: 0)
    with pytest.raises(UserError, match="no CUDA GPU"):
        make_pool(gpus=2)


def test_make_pool_defaults_to_one_worker_per_local_gpu(monkeypatch):
    monkeypatch.setattr(pools, "local_gpus", lambda: 0)
    with make_pool() as pool:
        assert pool.workers == 1  # a CPU-only machine
    monkeypatch.setattr(pools, "local_gpus", lambda: 2)
    with make_pool() as pool:
        assert pool.workers == 2
        got = by_key(pool.run(task("getenv", "CUDA_VISIBLE_DEVICES", key=k) for k in range(2)))
        assert {o.value for o in got.values()} <= {"0", "1"}


@pytest.mark.parametrize("jobs, weight_gb, free_gb, expected", [
    (12, 1.4, 139, 12),  # DeepSeek-V3@tp8 fp8-block128 on an H200: all twelve fit
    (12, 4.8, 60, 5),  # 30 GB for workers of 5.8 GB each
    (12, 10, 10, 0),  # not one fits in half of what is free: compile in the caller's process
    (3, 100, None, 3),  # free memory unknown (the interpreter): as asked
])
def test_compile_workers_fit_in_half_the_free_gpu_memory(jobs, weight_gb, free_gb, expected):
    gb = 1 << 30
    free = None if free_gb is None else int(free_gb * gb)
    assert workers_for(jobs, int(weight_gb * gb), free) == expected
    if expected:
        assert expected * (int(weight_gb * gb) + WORKER_OVERHEAD_BYTES) <= (free or float("inf")) / 2


def test_ray_missing_is_a_user_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(UserError, match=r"pip install 'moebench\[ray\]'"):
        make_pool(ray_address=True)


def test_ray_pool_values_errors_crashes_and_hangs():
    pytest.importorskip("ray")
    from moebench.workers.ray import RayPool

    pool = RayPool("local", env={"PYTHONPATH": str(TESTS)}, num_cpus=2, include_dashboard=False,
                   log_to_driver=False)
    try:
        assert pool.workers == 2  # the local instance's CPUs, no GPU
        got = by_key(pool.run([task("double", 3), task("fail", "bad config"), task("exit_now", 1),
                               task("nap", 60.0, timeout_s=1.0), task("pid")]))
    finally:
        pool.close()
    assert (got["double"].value, got["double"].failure) == (6, None)
    assert (got["fail"].failure, got["fail"].error) == ("error", "ValueError: bad config")
    assert got["exit_now"].failure == "crash" and "WorkerCrashedError" in got["exit_now"].error
    assert got["nap"].failure == "hang"
    assert got["pid"].failure is None and isinstance(got["pid"].value, int)


def test_a_pool_left_open_does_not_hold_up_the_exit():
    """Multiprocessing's exit hook joins worker processes, which wait for tasks: the pool must stop them
    first. The TemporaryDirectory registers weakref's own exit hook before multiprocessing's, as a library
    may, so a pool relying on weakref.finalize alone would hang here."""
    code = ("import tempfile\n"
            "if __name__ == '__main__':\n"
            "    keep = tempfile.TemporaryDirectory()\n"
            "    from moebench.workers.local import LocalPool\n"
            "    from moebench.workers.task import Task\n"
            "    pool = LocalPool(2)\n"
            "    print([o.value for o in pool.run([Task('workers_tasks:double', (4,), 'k')])])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert proc.returncode == 0 and proc.stdout.strip() == "[8]", proc.stderr
