"""A tune's failures are rows, not the end of the tune: configs that fail to compile, run out of resources,
answer wrongly, kill their worker or never answer each give one typed outcome, and the search goes on on the
same worker pool to the fastest good config. CPU only: ``PoolBench`` runs the stand-in jobs of
tests/tune_faulty_jobs.py (the config decides what happens) on a real ``LocalPool``.
"""

from __future__ import annotations

from collections import Counter

import pytest
import tune_faulty_jobs as faulty

from moebench.models import MoEShape
from moebench.problem import Problem
from moebench.tile import TileConfig
from moebench.tune.strategies import exhaustive
from moebench.workers import bench
from moebench.workers.bench import PoolBench
from moebench.workers.local import LocalPool

SHAPE = MoEShape("t", 8, 64, 32, 2)
MS = (1, faulty.TIME_CRASH_AT)
HANG_TIMEOUT_S = 2.0  # first runs here return at once: past this, a worker is hung

GOOD_A = TileConfig(16, 16, 64)
COMPILE = TileConfig(16, faulty.COMPILE_N, 64)
CRASH = TileConfig(faulty.CRASH_M, 16, 64)
RESOURCES = TileConfig(16, faulty.RESOURCES_N, 64)
HANG = TileConfig(16, 16, faulty.HANG_K)
INCORRECT = TileConfig(64, faulty.INCORRECT_N, 64)  # the fastest of all, were it right
TIME_CRASH = TileConfig(32, 16, 64, GROUP_SIZE_M=faulty.TIME_CRASH_GROUP)  # in one screen chunk with good ones
GOOD_B = TileConfig(32, 16, 64)  # after the crash and the hang: runs only if they cost just their own config
GOOD_C = TileConfig(64, 16, 128)  # the fastest good config
RANKED = [GOOD_A, COMPILE, CRASH, RESOURCES, HANG, INCORRECT, TIME_CRASH, GOOD_B, GOOD_C]
FIRST_RUN_FAILURES = {COMPILE: "compile", RESOURCES: "resources", CRASH: "crash", HANG: "hang"}


class Listed:
    """Candidates as the strategies read them: the same hand-made ranking at every M."""

    def ranked(self, M: int) -> list[TileConfig]:
        return list(RANKED)


class Recording:
    """A pool that passes tasks and outcomes through and keeps them, to see what ran where."""

    def __init__(self, pool: LocalPool):
        self.pool, self.workers = pool, pool.workers
        self.tasks, self.outcomes = [], []

    def run(self, tasks):
        def handed(tasks):
            for t in tasks:
                self.tasks.append(t)
                yield t

        for outcome in self.pool.run(handed(tasks)):
            self.outcomes.append(outcome)
            yield outcome

    def close(self) -> None:
        self.pool.close()


@pytest.fixture(scope="module")
def tuned():
    """One exhaustive search over RANKED at M in MS: (chosen per M, every new Timed in order, the pool)."""
    results = []
    with pytest.MonkeyPatch.context() as mp, LocalPool(1, initializer="tune_faulty_jobs:warm") as local:
        mp.setattr(bench, "COMPILE_TIMEOUT_S", HANG_TIMEOUT_S)  # read as the tasks are built, in this process
        pool = Recording(local)
        problems = {M: Problem(SHAPE, M, "fp16") for M in MS}
        pb = PoolBench("triton-classic", problems, pool, pool, results.append, jobs="tune_faulty_jobs")
        chosen = exhaustive.search(Listed(), pb, exhaustive.Options(final=4))
    return chosen, results, pool


def _of(results, cfg: TileConfig, M: int | None = None, phase: str | None = "any") -> list:
    return [t for t in results if t.config == cfg and (M is None or t.M == M) and (phase == "any" or t.phase == phase)]


def test_each_first_run_failure_is_one_typed_outcome_and_never_timed(tuned):
    _, results, _ = tuned
    for cfg, failure in FIRST_RUN_FAILURES.items():
        (t,) = _of(results, cfg)  # one row: compiled once (at the smallest M), then left out at every M
        assert (t.failure, t.phase, t.M, t.time_us) == (failure, None, min(MS), None), cfg.label
    assert "exit code 3" in _of(results, CRASH)[0].error
    assert f"no result after {HANG_TIMEOUT_S:g} s" in _of(results, HANG)[0].error


def test_a_wrong_answer_is_one_incorrect_outcome_per_m_and_not_re_timed(tuned):
    _, results, _ = tuned
    for M in MS:
        (t,) = _of(results, INCORRECT, M)
        assert (t.failure, t.phase, t.rel_err, t.time_us) == ("incorrect", "screen", faulty.INCORRECT_ERR, None)


def test_the_crash_and_the_hang_cost_only_their_own_config(tuned):
    """Configs ranked after them were compiled and timed at every M, on the one pool's one worker."""
    _, results, pool = tuned
    assert RANKED.index(GOOD_B) > max(RANKED.index(CRASH), RANKED.index(HANG))  # the precondition
    for cfg in (GOOD_B, GOOD_C):
        for M in MS:
            for phase in ("screen", "final"):
                (t,) = _of(results, cfg, M, phase)
                assert t.ok and t.time_us == faulty.time_us(Problem(SHAPE, M, "fp16"), cfg)
    assert {o.worker for o in pool.outcomes} == {0}
    first_runs = Counter(t.args[2] for t in pool.tasks if t.fn == "tune_faulty_jobs:first_run")
    assert sorted(first_runs.values()) == [1] * len(RANKED)  # each config first run once, the lost ones too


def test_a_chunk_a_crash_loses_is_re_run_a_config_per_task_and_only_the_culprit_crashes(tuned):
    _, results, pool = tuned
    M = faulty.TIME_CRASH_AT
    screened = [c for c in RANKED if c not in FIRST_RUN_FAILURES]
    timings = [t for t in pool.tasks if t.fn == "tune_faulty_jobs:time_configs" and t.args[3] == "screen"]
    chunks = [t.args[2] for t in timings if t.args[1].M == M]
    assert chunks == [screened] + [[c] for c in screened]  # the lost chunk, then each of its configs alone
    (t,) = _of(results, TIME_CRASH, M)
    assert (t.failure, t.phase) == ("crash", "screen") and "exit code 3" in t.error
    assert [t.config for t in results if t.failure == "crash" and t.phase is not None] == [TIME_CRASH]
    for cfg in screened:
        if cfg not in (TIME_CRASH, INCORRECT):
            (t,) = _of(results, cfg, M, "screen")
            assert t.ok
    (t,) = _of(results, TIME_CRASH, 1, "screen")  # at the other M it runs (its chunk there is whole)
    assert t.ok


def test_the_search_still_chooses_the_fastest_good_config(tuned):
    chosen, results, _ = tuned
    for M in MS:
        good = [t for t in results if t.M == M and t.phase == "final" and t.ok]
        assert chosen[M] == min(good, key=lambda t: t.time_us).config == GOOD_C


def test_a_tune_that_chose_nothing_at_an_m_fails_says_where_and_why_and_records_it(tmp_path, monkeypatch):
    """Every first run past its timeout: no config is chosen at M=1, so ``moebench tune`` exits 1 with the M
    and the reason in one line, gives no export hint, and meta.json records the run "failed" with that line."""
    import json
    import re

    from helpers import moebench_in_process

    monkeypatch.setattr(bench, "COMPILE_TIMEOUT_S", 0.01)  # read as the tasks are built, in this process
    out = tmp_path / "out"
    proc = moebench_in_process("tune", "--model", "tiny", "--m", "1", "--strategy", "exhaustive", "--option",
                               "limit=1", "--compile-jobs", "0", "--no-progress", "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("tune failed:")]
    assert re.fullmatch(r"tune failed: no config chosen at M=1: every config failed \(\d+ hang\)", line), line
    assert "export" not in proc.stderr and "Traceback" not in proc.stderr
    (meta_file,) = out.glob("*/meta.json")
    meta = json.loads(meta_file.read_text())
    assert meta["status"] == "failed" and meta["error"] == f"NothingChosen: {line.removeprefix('tune failed: ')}"


def test_a_tune_whose_gpu_ran_out_of_memory_says_so_and_what_leaves_more():
    """CUDA's out-of-memory is a "resources" failure of each config it struck, but no config's fault: the line
    of a tune that chose nothing names it apart from the configs the device cannot hold, with the remedy (the
    H200 tune of Llama-4-Scout fp8-channel said "every config failed (253 resources)")."""
    from moebench.measure.failures import out_of_memory
    from moebench.tune.run import OUT_OF_MEMORY, _nothing_chosen
    from moebench.workers.bench import Timed

    oom = Timed(GOOD_A, 1, "screen", failure="resources", error="OutOfMemoryError: CUDA out of memory. Tried to ...")
    smem = Timed(RESOURCES, 1, "screen", failure="resources", error="OutOfResources: out of resource: shared memory")
    assert out_of_memory(oom.failure, oom.error) and not out_of_memory(smem.failure, smem.error)
    line = _nothing_chosen({}, {}, {1: Counter({OUT_OF_MEMORY: 253}), 2: Counter({"resources": 4})})
    assert line.startswith(f"no config chosen at M=1: every config failed (253 {OUT_OF_MEMORY}); M=2: every config "
                           "failed (4 resources)")
    assert line.endswith("fewer compile workers (--compile-jobs) leave more of it to the timing")
    assert "--compile-jobs" not in _nothing_chosen({}, {}, {2: Counter({"resources": 4})})
