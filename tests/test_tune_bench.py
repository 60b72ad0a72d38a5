"""What resuming a tune relies on: ``Kept`` serves an interrupted run's outcomes again, each once and in the order
measured, and the fast strategy asks for the same measurements whenever it gets the same answers (in this process
or another), so a resumed tune served its rows takes the same decisions and measures only what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest

from moebench.hardware import HOPPER
from moebench.models import get_model
from moebench.problem import Problem
from moebench.space.declared import get_space
from moebench.space.prune import Facts
from moebench.tile import TileConfig
from moebench.tune.candidates import Candidates
from moebench.tune.costmodel import estimate_us
from moebench.tune.strategies import fast
from moebench.workers.bench import Bench, Kept, PoolBench, Timed
from moebench.workers.task import Outcome

MS = (1, 16, 256)


def problems() -> dict[int, Problem]:
    return {M: Problem(get_model("qwen3-30b-a3b"), M, "bf16") for M in MS}


def candidates() -> Candidates:
    return Candidates(get_space("triton-classic"),
                      {M: Facts.of(p, "triton-classic", HOPPER) for M, p in problems().items()})


# --- Kept --------------------------------------------------------------------------------------------------

A, B = TileConfig(16, 64, 128), TileConfig(32, 64, 128)


def test_kept_serves_each_outcome_once_in_order_per_m_config_and_phase():
    rows = [Timed(A, 1, "screen", 10.0), Timed(A, 1, "screen", 11.0), Timed(A, 1, "final", 12.0),
            Timed(A, 16, "screen", 13.0), Timed(B, 1, "screen", 14.0),
            Timed(B, 1, None, failure="resources", error="out of shared memory")]
    kept = Kept(rows)
    assert len(kept) == 6
    same_as_a = TileConfig(**A.as_dict())  # served by the config's value, not the object
    assert kept.take(1, same_as_a, "screen").time_us == 10.0
    assert kept.take(1, A, "screen").time_us == 11.0
    assert kept.take(1, A, "screen") is None  # each once
    assert kept.take(16, A, "final") is None  # another phase at that M was never kept
    assert kept.take(1, A, "final").time_us == 12.0
    assert kept.take(16, A, "screen").time_us == 13.0
    assert kept.take(1, B, None).failure == "resources"
    assert len(kept) == 1  # B's screen at M = 1 is left
    assert kept.take(1, B, "screen").time_us == 14.0 and len(kept) == 0
    assert Kept().take(1, A, "screen") is None


# --- fixed answers -----------------------------------------------------------------------------------------

def _u(*parts) -> float:
    """A fixed pseudo-random number in [0, 1) for ``parts``, the same in every process."""
    return zlib.crc32(repr(parts).encode()) / 2**32


def builds(cfg: TileConfig) -> bool:
    return _u("build", cfg.key()) > 0.08  # about 1 in 12 configs fails to compile


def answer(cfg: TileConfig, M: int, facts: dict[int, Facts]) -> tuple:
    """A timing result (``workers.jobs.Result``): the model's time, off by up to 30% either way so that the climb
    has somewhere to go; about 1 in 30 outputs wrong."""
    if _u("check", M, cfg.key()) < 0.03:
        return None, None, None, None, 0.5, "incorrect", "output mismatch"
    t = estimate_us(cfg, facts[M]) * (0.7 + 0.6 * _u("time", M, cfg.key()))
    return t, 0.99 * t, 1.01 * t, 10, 0.0, None, None


class FixedBench(Bench):
    """A Bench double that answers from ``answer`` and keeps every call it was asked, in order."""

    def __init__(self, cands: Candidates):
        self.ms, self.facts = cands.ms, cands.facts
        self.calls: list = []
        self.compiled: set[tuple] = set()

    def compile(self, configs):
        self.calls.append(("compile", [c.key() for c in configs]))
        self.compiled |= {c.key() for c in configs}
        return {c.key(): Timed(c, self.ms[0], None, failure="resources") for c in configs if not builds(c)}

    def time(self, work, phase):
        self.calls.append((phase, [(M, [c.key() for c in cs]) for M, cs in work.items()]))
        assert all(c.key() in self.compiled for cs in work.values() for c in cs), "timed before compiled"
        return {M: [Timed.of(c, M, phase, answer(c, M, self.facts)) for c in cs] for M, cs in work.items()}


def fast_on_fixed_answers() -> dict:
    """The fast strategy's choices and calls on fixed answers, as JSON (what a second process prints)."""
    bench = FixedBench(candidates())
    chosen = fast.search(candidates(), bench)
    return json.loads(json.dumps({"chosen": {str(M): c.key() for M, c in chosen.items()}, "calls": bench.calls}))


def test_fast_asks_for_the_same_measurements_given_the_same_answers():
    first = fast_on_fixed_answers()
    screens = [c for c in first["calls"] if c[0] == "screen"]
    assert len(screens) >= 3, "the search did not climb: the test does not reach the climb"
    failed = [k for c in first["calls"] if c[0] == "compile" for k in c[1] if not builds(TileConfig(*k))]
    assert failed, "no compile failed: the test does not reach the failure path"
    assert fast_on_fixed_answers() == first


def test_fast_asks_for_the_same_measurements_in_another_process():
    # A resumed tune is a new process: string hashes and set orders there differ from this one's.
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_tune_bench as t; "
            "print(json.dumps(t.fast_on_fixed_answers()))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == fast_on_fixed_answers()


# --- a resumed tune ----------------------------------------------------------------------------------------

class FixedPool:
    """A worker pool that runs ``workers.jobs``' two tasks here, from ``builds`` and ``answer``."""

    workers = 1

    def __init__(self, facts: dict[int, Facts]):
        self.facts = facts

    def run(self, tasks):
        for task in tasks:
            if task.fn.endswith(":first_run"):
                _, _, cfg = task.args
                value = (None,) * 7 if builds(cfg) else (None,) * 5 + ("resources", "out of shared memory")
            else:
                _, problem, cfgs, _ = task.args
                value = [answer(c, problem.M, self.facts) for c in cfgs]
            yield Outcome(task.key, value, None, None, 0, 0.0)

    def close(self) -> None:
        pass


class Stop(Exception):
    """The tune is killed here."""


def pool_tune(kept: Kept | None = None, stop_after: int | None = None, two_pools: bool = False):
    """A fast tune on fixed pools: (choices, or None where it was stopped; the rows it wrote, in order). With
    ``two_pools``, compiling and timing overlap (``PoolBench.compile_and_time``)."""
    cands, rows = candidates(), []

    def on_result(timed: Timed) -> None:
        rows.append(timed)
        if len(rows) == stop_after:
            raise Stop

    pool = FixedPool(cands.facts)
    bench = PoolBench("triton-classic", problems(), FixedPool(cands.facts) if two_pools else pool, pool, on_result,
                      kept)
    try:
        return fast.search(cands, bench), rows
    except Stop:
        return None, rows


@pytest.mark.parametrize("where", ["among the compile failures", "half way"])
def test_a_resumed_tune_takes_the_same_decisions_and_measures_only_what_is_missing(where):
    chosen, rows = pool_tune()
    compile_failures = sum(1 for t in rows if t.phase is None)
    assert compile_failures > 3 and len(rows) > 2 * compile_failures  # the cuts fall where they say
    cut = 3 if where == "among the compile failures" else len(rows) // 2
    stopped, written = pool_tune(stop_after=cut)
    assert stopped is None and written == rows[:cut]
    kept = Kept(written)
    resumed, new = pool_tune(kept=kept)
    assert resumed == chosen
    assert len(kept) == 0, "a kept row was not served again"
    assert new == rows[cut:], "the resumed tune measured something it had, or not what the first one would have"


def test_a_resumed_overlapped_tune_takes_the_same_decisions_and_measures_only_what_is_missing():
    """With compiling and timing overlapped the rows' order depends on which first run comes first, so what is
    measured again is compared as a set."""
    chosen, rows = pool_tune(two_pools=True)
    assert chosen == pool_tune()[0]
    cut = len(rows) // 2
    stopped, written = pool_tune(stop_after=cut, two_pools=True)
    assert stopped is None and len(written) == cut
    kept = Kept(written)
    resumed, new = pool_tune(kept=kept, two_pools=True)
    assert resumed == chosen and len(kept) == 0

    def what(ts):
        return sorted((t.M, t.config.key(), t.phase or "") for t in ts)

    assert what(written + new) == what(rows)


def test_the_bench_counts_what_each_phase_compiled_or_timed_and_kept_rows_cost_nothing():
    """``split``: per phase, the configs compiled or the (M, config) pairs timed, and the wall time spent; a
    resumed tune's kept answers are not counted, as they were not measured again."""
    cands, seen = candidates(), []
    pool = FixedPool(cands.facts)
    bench = PoolBench("triton-classic", problems(), pool, pool, seen.append)
    configs = cands.ranked(16)[:6]
    failed = bench.compile(configs)
    bench.time({M: configs for M in MS}, "screen")
    split = bench.split()
    assert split["compile"]["n"] == len(configs)
    assert split["screen"]["n"] == len(MS) * (len(configs) - len(failed))
    assert all(v["s"] >= 0 for v in split.values())
    again = PoolBench("triton-classic", problems(), pool, pool, lambda t: None, Kept(seen))
    again.compile(configs)
    again.time({M: configs for M in MS}, "screen")
    assert again.split()["compile"]["n"] == len(configs) - len(failed)  # a first run that ran left no row
    assert again.split()["screen"]["n"] == 0


class LoggedPool(FixedPool):
    """A FixedPool that logs what it runs; as a compile pool (``hold``), it holds back its later first runs until
    a timing has run, so a bench that overlaps the two is seen to (and one that does not would wait forever:
    the hold gives up after a few seconds)."""

    def __init__(self, facts, log: list, name: str, hold: threading.Event | None = None, timed=None):
        super().__init__(facts)
        self.log, self.name, self.hold, self.timed = log, name, hold, timed

    def run(self, tasks):
        tasks = list(tasks)
        for i, outcome in enumerate(super().run(tasks)):
            if self.hold is not None and i == len(tasks) // 2:
                self.hold.wait(timeout=5)
            self.log.append((self.name, outcome.key))
            yield outcome
        if self.timed is not None:
            self.timed.set()


def test_compile_and_time_overlaps_the_pools_and_answers_as_one_after_the_other():
    cands = candidates()
    work = {M: cands.ranked(M)[:20] for M in MS}
    log, timed = [], threading.Event()
    compiling = LoggedPool(cands.facts, log, "compile", hold=timed)
    timing = LoggedPool(cands.facts, log, "time", timed=timed)
    overlapped = PoolBench("triton-classic", problems(), compiling, timing, lambda t: None)
    failed, screens = overlapped.compile_and_time(work, "screen")
    names = [name for name, _ in log]
    assert names.index("time") < len(names) - 1 - names[::-1].index("compile"), "no timing before the last first run"
    pool = FixedPool(cands.facts)
    plain = PoolBench("triton-classic", problems(), pool, pool, lambda t: None)  # one pool: one after the other
    failed_plain, screens_plain = plain.compile_and_time(work, "screen")
    assert failed.keys() == failed_plain.keys() and failed, "no compile failed: the test misses that path"
    assert {M: [(t.config.key(), t.time_us) for t in ts] for M, ts in screens.items()} == {
        M: [(t.config.key(), t.time_us) for t in ts] for M, ts in screens_plain.items()}
    assert overlapped.split()["screen"]["n"] == plain.split()["screen"]["n"]


def test_compile_and_time_raises_what_broke_the_compile_pool():
    class Broken(FixedPool):
        def run(self, tasks):
            raise OSError("the pool's pipe broke")
            yield

    cands = candidates()
    bench = PoolBench("triton-classic", problems(), Broken(cands.facts), FixedPool(cands.facts), lambda t: None)
    with pytest.raises(OSError, match="pipe broke"):
        bench.compile_and_time({1: cands.ranked(1)[:4]}, "screen")
