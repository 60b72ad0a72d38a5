"""A stand-in for ``workers.pools.Pools`` whose benches answer in this process from a table of made-up times, for
tests/test_retime.py and tests/test_merge_with.py: no GPU, no worker process, no kernel run.

A config's time is ``times[config key]`` (``BASE_US`` for any other), the same at every M; its p20 and p80 are 1%
either side, so the noise band is compare's least (3%), and a config 30% slower is SLOWER beyond it. A config
in ``broken`` fails to compile. Every timing goes to the bench's ``on_result``, as ``PoolBench``'s do.
"""

from __future__ import annotations

from moebench.tile import TileConfig
from moebench.workers.bench import Bench, Timed

BASE_US = 100.0


class FakeBench(Bench):
    def __init__(self, problems, on_result, times: dict, broken: set, log: list):
        self.ms = tuple(sorted(problems))
        self.on_result, self.times, self.broken, self.log = on_result, times, broken, log

    def compile(self, configs):
        failed = {}
        for c in configs:
            if c.key() in self.broken:
                failed[c.key()] = Timed(c, self.ms[0], None, failure="compile", error="made up")
                self.on_result(failed[c.key()])
        return failed

    def time(self, work, phase):
        out = {}
        for M, configs in work.items():
            out[M] = []
            for c in configs:
                t = self.times.get(c.key(), BASE_US)
                timed = Timed(c, M, phase, t, 0.99 * t, 1.01 * t, 10, 1e-4)
                self.log.append((M, c.key(), phase))
                self.on_result(timed)
                out[M].append(timed)
        return out


class FakePools:
    """``Pools`` as the commands use it: ``bench(path, problems, on_result, on_progress)``, a context manager."""

    times: dict = {}
    broken: set = set()

    def __init__(self, *args, **kwargs):
        self.log: list = []
        self.paths: list[str] = []

    def bench(self, path, problems, on_result, on_progress=None):
        self.paths.append(path)
        return FakeBench(problems, on_result, self.times, self.broken, self.log)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def pools_with(times: dict[TileConfig, float], broken: tuple[TileConfig, ...] = ()) -> type[FakePools]:
    """A ``FakePools`` class whose benches answer ``times`` (by config) and fail ``broken``."""
    return type("Pools", (FakePools,), {"times": {c.key(): t for c, t in times.items()},
                                        "broken": {c.key() for c in broken}})
