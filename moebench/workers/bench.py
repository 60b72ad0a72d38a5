"""Measurements of configs on worker pools: what a strategy, ``retime``, ``--merge-with`` and ``fit-time`` ask
for (compile these, time those at each M) and who answers.

A caller sees a ``Bench``: ``compile(configs)`` before it times them, then ``time({M: configs}, phase)``, or
both at once with ``compile_and_time``. ``PoolBench`` answers on workers (``workers.pools.Pools``): first runs on a
compile pool, timings on a pool of one worker per GPU, a batch per M so several GPUs time several M at once;
in ``compile_and_time`` the GPU times what has compiled while the CPUs compile the rest. Every new measurement goes to
``on_result`` (the run writes it as a row). Answers already in the rows of an interrupted run (``Kept``) are
served from there in the order they were measured, so a resumed tune takes the same decisions and writes
only what is missing. ``ReplayBench`` (``tune.replay``) answers from recorded timings, for tests.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moebench.tile import TileConfig
from moebench.workers.task import Pool, Task

if TYPE_CHECKING:  # annotations only: strategies, and so --strategy's choices, load no torch
    from moebench.problem import Problem

CHUNK = 48  # configs per timing task: a hang or a crash costs at most this many, which are then run one by one
COMPILE_TIMEOUT_S = 300.0
TIME_TIMEOUT_S = 30.0  # per config of a timing task, on top of the first minute


@dataclass(frozen=True)
class Timed:
    """One config's outcome at one M: a time, or the failure that stopped it."""

    config: TileConfig
    M: int
    phase: str | None  # "screen" / "final"; None for a first run
    time_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    reps: int | None = None
    rel_err: float | None = None
    failure: str | None = None
    error: str | None = None

    @classmethod
    def of(cls, config: TileConfig, M: int, phase: str | None, result: Sequence) -> Timed:
        return cls(config, M, phase, *result)

    @property
    def ok(self) -> bool:
        return self.failure is None


def timed_row(problem: Problem, path: str, target, t: Timed, *, phase: str | None,
              source: str | None = None) -> dict:
    """The run folder's row of one outcome ``t`` of ``problem`` on ``path`` (``target``: where it ran), marked
    ``phase`` (None: a row as a sweep's) and ``source`` (``config_source``: where the config came from)."""
    from dataclasses import replace

    from moebench.measure.timer import run_method
    from moebench.store.rows import Row

    status = "ok" if t.ok else ("incorrect" if t.failure == "incorrect" else "error")
    method = None if t.time_us is None else run_method(target.interpreter)
    return replace(Row.for_point(problem, path, target), config=t.config.as_dict(), status=status,
                   correct=None if t.rel_err is None and not t.ok else t.failure != "incorrect", rel_err=t.rel_err,
                   time_us=t.time_us, time_p20_us=t.p20_us, time_p80_us=t.p80_us, reps=t.reps,
                   timing_method=method, error=t.error, phase=phase, failure=t.failure,
                   config_source=source).as_dict()


def unique(configs: Iterable[TileConfig]) -> list[TileConfig]:
    """``configs`` without repeats (by key), in order."""
    return list({c.key(): c for c in configs}.values())


def fastest(timed: Iterable[Timed], n: int = 1) -> list[Timed]:
    """Up to ``n`` of ``timed`` that ran, fastest first."""
    return sorted((t for t in timed if t.ok and t.time_us is not None), key=lambda t: t.time_us)[:n]


class Bench:
    """What strategies measure through (see the module docstring)."""

    ms: tuple[int, ...]

    def compile(self, configs: Sequence[TileConfig]) -> dict[tuple, Timed]:
        """Make ``configs`` runnable; the failures, by config key (those configs are then never timed)."""
        raise NotImplementedError

    def time(self, work: Mapping[int, Sequence[TileConfig]], phase: str) -> dict[int, list[Timed]]:
        """Each M's configs timed at ``phase``'s budget (failures included), in the order given."""
        raise NotImplementedError

    def compile_and_time(self, work: Mapping[int, Sequence[TileConfig]],
                         phase: str) -> tuple[dict[tuple, Timed], dict[int, list[Timed]]]:
        """``compile`` every config of ``work``, then ``time`` each M's that compiled: (the compile failures by
        config key, the timings by M). A bench may overlap the two; the answers are the same."""
        failed = self.compile(unique(c for cs in work.values() for c in cs))
        return failed, self.time({M: [c for c in cs if c.key() not in failed] for M, cs in work.items()}, phase)


class Kept:
    """Outcomes of an interrupted run, from its rows: served again, in order, per (M, config, phase)."""

    def __init__(self, timed: Sequence[Timed] = ()):
        self._queues: dict[tuple, deque[Timed]] = defaultdict(deque)
        for t in timed:
            self._queues[(t.M, t.config.key(), t.phase)].append(t)

    def take(self, M: int, cfg: TileConfig, phase: str | None) -> Timed | None:
        queue = self._queues.get((M, cfg.key(), phase))
        return queue.popleft() if queue else None

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())


class PoolBench(Bench):
    """Measurements on worker pools: ``compile_pool`` for first runs, ``time_pool`` for timings, by the
    functions of the module ``jobs`` (``first_run``, ``time_configs``: see ``workers.jobs``)."""

    def __init__(self, path: str, problems: Mapping[int, Problem], compile_pool: Pool, time_pool: Pool,
                 on_result: Callable[[Timed], None], kept: Kept | None = None,
                 on_progress: Callable[[str, int, int], None] | None = None, jobs: str = "moebench.workers.jobs"):
        self.path, self.problems = path, dict(problems)
        self.jobs = jobs  # the module whose first_run and time_configs the tasks call (tests swap in another)
        self.ms = tuple(sorted(self.problems))
        self.compile_pool, self.time_pool = compile_pool, time_pool
        self.on_result, self.kept = on_result, kept or Kept()
        self.on_progress = on_progress or (lambda what, done, total: None)
        self.failed: dict[tuple, Timed] = {}
        self.seconds: dict[str, float] = defaultdict(float)  # wall time spent per phase ("compile", "screen", ...)
        self.counts: dict[str, int] = defaultdict(int)  # configs compiled, or (M, config) pairs timed, per phase

    def split(self) -> dict[str, dict]:
        """Per phase, the wall seconds spent and the configs compiled or timed: where a tune's time goes.
        Overlapped phases (``compile_and_time``) both count the time they overlap."""
        return {phase: {"s": round(s, 1), "n": self.counts[phase]} for phase, s in self.seconds.items()}

    def _new(self, timed: Timed) -> Timed:
        self.on_result(timed)
        return timed

    def compile(self, configs: Sequence[TileConfig]) -> dict[tuple, Timed]:
        started = time.monotonic()
        try:
            return self._compile(configs)
        finally:
            self.seconds["compile"] += time.monotonic() - started

    def _compile(self, configs: Sequence[TileConfig]) -> dict[tuple, Timed]:
        todo = self._to_compile(configs)
        done = 0
        self.on_progress("compile", 0, len(todo))
        for outcome in self.compile_pool.run(self._compile_tasks(todo)):
            done += 1
            self._compiled(todo[outcome.key], outcome)
            self.on_progress("compile", done, len(todo))
        asked = {c.key() for c in configs}
        return {k: v for k, v in self.failed.items() if k in asked}

    def _to_compile(self, configs: Iterable[TileConfig]) -> dict[tuple, TileConfig]:
        """The configs not compiled yet (a kept first-run failure is taken as it was), by key, in order."""
        m0 = self.ms[0]  # token counts are not specialized: any M compiles the same kernels; the smallest runs fastest
        todo = {}
        for cfg in unique(c for c in configs if c.key() not in self.failed):
            kept = self.kept.take(m0, cfg, None)
            if kept is not None:
                self.failed[cfg.key()] = kept
            else:
                todo[cfg.key()] = cfg
        self.counts["compile"] += len(todo)
        return todo

    def _compile_tasks(self, todo: Mapping[tuple, TileConfig]) -> list[Task]:
        m0 = self.ms[0]
        return [Task(f"{self.jobs}:first_run", (self.path, self.problems[m0], c), k, COMPILE_TIMEOUT_S)
                for k, c in todo.items()]

    def _compiled(self, cfg: TileConfig, outcome) -> bool:
        """Take a first run's outcome: a failure is recorded (and the config never timed); whether it ran."""
        result = outcome.value if outcome.failure is None else (None,) * 5 + (outcome.failure, outcome.error)
        timed = Timed.of(cfg, self.ms[0], None, result)
        if not timed.ok:
            self.failed[cfg.key()] = self._new(timed)
        return timed.ok

    def compile_and_time(self, work: Mapping[int, Sequence[TileConfig]],
                         phase: str) -> tuple[dict[tuple, Timed], dict[int, list[Timed]]]:
        """As ``Bench.compile_and_time``, overlapped where compiling and timing run on different pools: a thread
        collects first runs as they finish, and this one times each M's configs that have compiled (all that
        are ready at once, a batch per M), waiting only when none is. Rows are written from this thread only."""
        if self.compile_pool is self.time_pool:  # one pool (the interpreter, Ray): one after the other
            return super().compile_and_time(work, phase)
        started = time.monotonic()
        todo = self._to_compile(c for cs in work.values() for c in cs)
        tasks = self._compile_tasks(todo)
        arrived: queue.Queue = queue.Queue()  # first runs' outcomes; None once all came; an exception if one broke
        stop = threading.Event()

        def collect() -> None:
            try:
                for outcome in self.compile_pool.run(tasks):
                    arrived.put(outcome)
                    if stop.is_set():
                        return
            except BaseException as e:  # told to the timing thread, which raises it
                arrived.put(e)
            finally:
                arrived.put(None)

        ready = {k for cs in work.values() for c in cs if (k := c.key()) not in todo}  # compiled before
        pending = {M: list(cs) for M, cs in work.items()}
        answers: dict[int, list[Timed]] = {M: [] for M in work}
        state = {"compiling": True, "compiled": 0}
        progress, self.on_progress = self.on_progress, _Counting(self.on_progress, phase)

        def take(block: bool) -> None:
            """First runs that came (waiting for one where ``block``): failures recorded, the rest ready."""
            while state["compiling"]:
                try:
                    item = arrived.get(block=block)
                except queue.Empty:
                    return
                block = False
                if item is None:
                    state["compiling"] = False
                    self.seconds["compile"] += time.monotonic() - started
                elif isinstance(item, BaseException):
                    raise item
                else:
                    state["compiled"] += 1
                    if self._compiled(todo[item.key], item):
                        ready.add(item.key)
                    progress("compile", state["compiled"], len(todo))

        threading.Thread(target=collect, name="compile", daemon=True).start()
        try:
            progress("compile", 0, len(todo))
            while True:
                take(block=False)
                batch = {M: [c for c in cs if c.key() in ready] for M, cs in pending.items()}
                batch = {M: cs for M, cs in batch.items() if cs}
                if not batch:
                    if not state["compiling"]:
                        break
                    take(block=True)  # nothing to time: wait for a first run
                    continue
                for M, ts in self.time(batch, phase).items():
                    answers[M] += ts
                pending = {M: [c for c in cs if c.key() not in ready and c.key() not in self.failed]
                           for M, cs in pending.items()}
        finally:
            stop.set()
            self.on_progress = progress
        order = {M: {c.key(): i for i, c in enumerate(cs)} for M, cs in work.items()}
        answers = {M: sorted(ts, key=lambda t: order[M][t.config.key()]) for M, ts in answers.items()}
        asked = {c.key() for cs in work.values() for c in cs}
        return {k: v for k, v in self.failed.items() if k in asked}, answers

    def time(self, work: Mapping[int, Sequence[TileConfig]], phase: str) -> dict[int, list[Timed]]:
        answers: dict[tuple, Timed] = {}
        missing: dict[int, list[TileConfig]] = {}
        for M, configs in work.items():
            for cfg in configs:
                if cfg.key() in self.failed:
                    continue
                kept = self.kept.take(M, cfg, phase)
                if kept is not None:
                    answers[(M, cfg.key())] = kept
                else:
                    missing.setdefault(M, []).append(cfg)
        started = time.monotonic()
        self.counts[phase] += sum(len(cs) for cs in missing.values())
        for timed in self._measure(missing, phase):
            answers[(timed.M, timed.config.key())] = self._new(timed)
        self.seconds[phase] += time.monotonic() - started
        return {M: [answers[(M, c.key())] for c in configs if (M, c.key()) in answers] for M, configs in work.items()}

    def _measure(self, work: Mapping[int, Sequence[TileConfig]], phase: str) -> list[Timed]:
        """Timing tasks of up to CHUNK configs; a chunk lost to a hang or a crash is run again a config per
        task, so only the config that caused it gets that failure."""
        def tasks(chunks):
            return [Task(f"{self.jobs}:time_configs", (self.path, self.problems[M], list(cs), phase),
                         (M, tuple(cs)), 60.0 + TIME_TIMEOUT_S * len(cs)) for M, cs in chunks]

        chunks = [(M, cs[i:i + CHUNK]) for M, cs in work.items() for i in range(0, len(cs), CHUNK)]
        total, done, out = sum(len(cs) for _, cs in chunks), 0, []
        self.on_progress(phase, 0, total)
        retry = []
        for outcome in self.time_pool.run(tasks(chunks)):
            M, cs = outcome.key
            if outcome.failure is None:
                out += [Timed.of(c, M, phase, r) for c, r in zip(cs, outcome.value)]
            elif len(cs) > 1 and outcome.failure in ("hang", "crash"):  # one config took the worker down
                retry += [(M, (c,)) for c in cs]
                continue
            else:  # the job itself failed (it reports a config's own failure as that config's result)
                out += [Timed(c, M, phase, failure=outcome.failure, error=outcome.error) for c in cs]
            done += len(cs)
            self.on_progress(phase, done, total)
        for outcome in self.time_pool.run(tasks(retry)):
            M, (c,) = outcome.key
            result = outcome.value[0] if outcome.failure is None else (None,) * 5 + (outcome.failure, outcome.error)
            out.append(Timed.of(c, M, phase, result))
            done += 1
            self.on_progress(phase, done, total)
        return out


class _Counting:
    """A progress callback that counts ``phase``'s timings over several ``time`` calls as one total."""

    def __init__(self, progress: Callable[[str, int, int], None], phase: str):
        self.progress, self.phase = progress, phase
        self.before = self.total = self.last = 0

    def __call__(self, what: str, done: int, total: int) -> None:
        if what != self.phase:
            self.progress(what, done, total)
            return
        if done == 0:  # a new call: what the previous ones timed stays counted
            self.before += self.last
            self.total += total
        self.last = done
        self.progress(what, self.before + done, self.total)
