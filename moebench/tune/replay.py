"""A bench that answers from recorded timings, so strategies run and are tested without a GPU.

The recording is an exhaustive tune's rows: per (M, config) a screen time or a failure. A replayed screen
or final time is the recorded screen time times lognormal noise (``noise``, seeded), so a strategy is
judged on noisy times as on the GPU, and is scored on the recorded times. It also keeps the cost a run
would have spent: compiles (``compile_s`` each, ``workers`` at once) and timings (``screen_s`` /
``final_s`` each).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence

from moebench.tile import TileConfig
from moebench.workers.bench import Bench, Timed


class ReplayBench(Bench):
    def __init__(self, times: Mapping[tuple[int, tuple], float | None], noise: float = 0.02, seed: int = 0,
                 compile_s: float = 1.5, workers: int = 15, screen_s: float = 0.006, final_s: float = 0.05):
        """``times``: (M, config key) -> recorded time in microseconds, or None for a config that failed."""
        self.times = dict(times)
        self.ms = tuple(sorted({M for M, _ in self.times}))
        self.noise, self.rng = noise, random.Random(seed)
        self.compile_s, self.workers, self.screen_s, self.final_s = compile_s, workers, screen_s, final_s
        self.compiled: set[tuple] = set()
        self.failed: set[tuple] = set()  # configs whose first run failed: never timed, as on the GPU
        self.measured: dict[str, int] = defaultdict(int, screen=0, final=0)  # timings per phase

    def compile(self, configs: Sequence[TileConfig]) -> dict[tuple, Timed]:
        failed = {}
        for c in configs:
            self.compiled.add(c.key())
            if any(self.times.get((M, c.key()), 0.0) is None for M in self.ms):
                failed[c.key()] = Timed(c, self.ms[0], None, failure="compile", error="recorded as failed")
                self.failed.add(c.key())
        return failed

    def time(self, work: Mapping[int, Sequence[TileConfig]], phase: str) -> dict[int, list[Timed]]:
        out = {}
        for M, configs in work.items():
            out[M] = []
            for c in configs:
                if c.key() not in self.compiled:
                    raise AssertionError(f"timed before it was compiled: {c.label}")
                if c.key() in self.failed:
                    continue
                t = self.times.get((M, c.key()))
                self.measured[phase] += 1
                if t is None:
                    out[M].append(Timed(c, M, phase, failure="error", error="not recorded"))
                else:
                    noisy = t * math.exp(self.rng.gauss(0.0, self.noise if phase == "screen" else self.noise / 3))
                    out[M].append(Timed(c, M, phase, time_us=noisy))
        return out

    @property
    def seconds(self) -> float:
        """What the replayed search would have cost on the GPU: compiles in parallel, timings one by one."""
        return (math.ceil(len(self.compiled) / self.workers) * self.compile_s
                + self.measured["screen"] * self.screen_s + self.measured["final"] * self.final_s)
