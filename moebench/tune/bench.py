"""The tuner's measurements: what strategies ask for (compile these, time those at each M) and who answers.

A strategy sees a ``Bench``: ``compile(configs)`` before it times them, then ``time({M: configs}, phase)``.
``PoolBench`` answers on workers (``workers.pools``): first runs on a compile pool, timings on a pool of one
worker per GPU, a batch per M so several GPUs time several M at once. Every new measurement goes to
``on_result`` (the run writes it as a row). Answers already in the rows of an interrupted run (``Kept``) are
served from there in the order they were measured, so a resumed tune takes the same decisions and writes
only what is missing. ``ReplayBench`` (``tune.replay``) answers from recorded timings, for tests.
"""

from __future__ import annotations

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
        """Per phase, the wall seconds spent and the configs compiled or timed: where a tune's time goes."""
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
        m0 = self.ms[0]  # token counts are not specialized: any M compiles the same kernels; the smallest runs fastest
        todo = []
        for cfg in dict((c.key(), c) for c in configs if c.key() not in self.failed).values():
            kept = self.kept.take(m0, cfg, None)
            if kept is not None:
                self.failed[cfg.key()] = kept
            else:
                todo.append(cfg)
        self.counts["compile"] += len(todo)
        tasks = [Task(f"{self.jobs}:first_run", (self.path, self.problems[m0], c), c.key(), COMPILE_TIMEOUT_S)
                 for c in todo]
        by_key = {c.key(): c for c in todo}
        done = 0
        self.on_progress("compile", 0, len(tasks))
        for outcome in self.compile_pool.run(tasks):
            done += 1
            cfg = by_key[outcome.key]
            result = outcome.value if outcome.failure is None else (None,) * 5 + (outcome.failure, outcome.error)
            timed = Timed.of(cfg, m0, None, result)
            if not timed.ok:
                self.failed[cfg.key()] = self._new(timed)
            self.on_progress("compile", done, len(tasks))
        asked = {c.key() for c in configs}
        return {k: v for k, v in self.failed.items() if k in asked}

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
