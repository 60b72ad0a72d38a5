"""The search strategies replayed on the recorded exhaustive H200 tunes (``ReplayBench``): exhaustive finds the
recorded best at every M; the fast strategy, on noisy replayed times, chooses within 2% of it, times far fewer
configs and costs under three minutes, never timing what it has not compiled or what the rules drop.

The candidates are built as ``moebench tune`` builds them (``tune.run``); a recorded time is an exhaustive
tune's screen time, and "the recorded best" at an M is the lowest of them.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import pytest

from moebench.hardware import HOPPER, DeviceLimits
from moebench.models import get_model, shard
from moebench.paths.registry import get_path
from moebench.problem import Problem
from moebench.space.declared import get_space
from moebench.space.prune import Facts
from moebench.tile import TileConfig
from moebench.tune.candidates import Candidates
from moebench.tune.record import replay_times
from moebench.tune.replay import ReplayBench
from moebench.tune.strategies import exhaustive, fast

RECORDED = Path(__file__).parent / "data" / "h200-tune-exhaustive"  # screen times of exhaustive H200 tunes
RECORDINGS = {
    "qwen3-30b-a3b-bf16": (lambda: get_model("qwen3-30b-a3b"), "bf16"),
    "deepseek-v3-tp8-fp8-block128": (lambda: shard(get_model("deepseek-v3"), tp=8), "fp8-block128"),
}
SEEDS = range(5)  # noise seeds of the fast strategy's replays
NOISE = 0.02  # lognormal sigma of a replayed screen time (the replay's default)
WITHIN = 1.02  # the fast strategy's choice, against the recorded best
BUDGET_S = 180.0  # what a fast tune of four M may cost on the GPU


class Watched(ReplayBench):
    """A replay that keeps each (M, config key, phase) it was asked to time, in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.timed: list[tuple[int, tuple, str]] = []

    def time(self, work, phase):
        self.timed += [(M, c.key(), phase) for M, cs in work.items() for c in cs]
        return super().time(work, phase)


@cache
def recording(name: str):
    """(recorded times, candidates, the recorded best time per M)."""
    times = replay_times(RECORDED / f"{name}.csv.gz")
    ms = sorted({M for M, _ in times})
    shape, dtype = RECORDINGS[name][0](), RECORDINGS[name][1]
    cands = Candidates(get_space("triton-classic"),
                       {M: Facts.of(Problem(shape, M, dtype), "triton-classic", HOPPER) for M in ms})
    best = {M: min(t for (m, _), t in times.items() if m == M and t is not None) for M in ms}
    return times, cands, best


@cache
def exhaustive_run(name: str):
    times, cands, _ = recording(name)
    bench = Watched(times, noise=0.0)
    return bench, exhaustive.search(cands, bench)


@cache
def fast_runs(name: str):
    times, cands, _ = recording(name)
    runs = []
    for seed in SEEDS:
        bench = Watched(times, noise=NOISE, seed=seed)
        runs.append((bench, fast.search(cands, bench)))
    return runs


@pytest.mark.parametrize("name", RECORDINGS)
def test_exhaustive_finds_the_recorded_best_at_every_m(name):
    times, _, best = recording(name)
    _, chosen = exhaustive_run(name)
    assert set(chosen) == set(best)
    for M, cfg in chosen.items():
        assert cfg is not None and times[(M, cfg.key())] == best[M], f"M={M}: {cfg and cfg.label}"


@pytest.mark.parametrize("name", RECORDINGS)
def test_fast_chooses_within_2_percent_of_the_recorded_best_at_every_m(name):
    times, _, best = recording(name)
    ratios = {}
    for seed, (_, chosen) in zip(SEEDS, fast_runs(name)):
        assert set(chosen) == set(best) and None not in chosen.values(), f"seed {seed}: an M has no choice"
        ratios.update({(seed, M): times[(M, cfg.key())] / best[M] for M, cfg in chosen.items()})
    seed, M = max(ratios, key=ratios.get)
    assert ratios[(seed, M)] <= WITHIN, f"worst: {ratios[(seed, M)]:.4f}x the recorded best (seed {seed}, M={M})"


@pytest.mark.parametrize("name", RECORDINGS)
def test_fast_costs_under_three_minutes_and_a_quarter_of_exhaustives_timings(name):
    full, _ = exhaustive_run(name)
    for seed, (bench, _) in zip(SEEDS, fast_runs(name)):
        assert bench.seconds < BUDGET_S, f"seed {seed}: {bench.seconds:.0f} s"
        timed = sum(bench.measured.values())
        assert timed < sum(full.measured.values()) / 4, f"seed {seed}: {timed} timings, exhaustive {full.measured}"


@pytest.mark.parametrize("name", RECORDINGS)
def test_fast_times_only_what_the_rules_keep_and_what_compiled(name):
    times, cands, _ = recording(name)
    kept = {M: {c.key() for c in cands.ranked(M)} for M in cands.ms}
    for seed, (bench, _) in zip(SEEDS, fast_runs(name)):
        assert bench.timed
        for M, key, _phase in bench.timed:
            label = TileConfig(*key).label
            assert key in kept[M], f"seed {seed}, M={M}: {label} is dropped by the rules there"
            assert times.get((M, key)) is not None, f"seed {seed}, M={M}: {label} failed to compile, was timed"
        screened = [(M, key) for M, key, phase in bench.timed if phase == "screen"]
        assert len(screened) == len(set(screened)), "a config screened twice at one M"
        finals = {(M, key) for M, key, phase in bench.timed if phase == "final"}
        assert finals <= set(screened), "a config re-timed at an M it was not screened at"


@pytest.mark.parametrize("name", RECORDINGS)
def test_fast_without_sharing_seeds_screens_fewer_and_still_chooses_within_2_percent(name):
    """share=0 (each M screens only the seeds the model ranked for it): fewer screens on every noise seed, the
    choice within WITHIN of the recorded best on most noise seeds and within 3% on each: with fewer screens
    per M, a 2% screen noise can leave the best out of the final few at one M."""
    times, cands, best = recording(name)
    worst_per_seed = []
    for seed, (shared, _) in zip(SEEDS, fast_runs(name)):
        bench = Watched(times, noise=NOISE, seed=seed)
        chosen = fast.search(cands, bench, fast.Options(share=0))
        assert bench.measured["screen"] < shared.measured["screen"], f"seed {seed}"
        assert set(chosen) == set(best)
        worst_per_seed.append(max(times[(M, cfg.key())] / best[M] for M, cfg in chosen.items()))
    assert max(worst_per_seed) <= 1.03, worst_per_seed
    assert sorted(worst_per_seed)[len(worst_per_seed) // 2] <= WITHIN, worst_per_seed


@pytest.mark.parametrize("name", RECORDINGS)
def test_exhaustive_screens_each_config_the_rules_keep_at_each_m_once(name):
    times, cands, _ = recording(name)
    bench, _ = exhaustive_run(name)
    screened = [(M, key) for M, key, phase in bench.timed if phase == "screen"]
    assert len(screened) == len(set(screened))
    kept = {(M, c.key()) for M in cands.ms for c in cands.ranked(M)}
    ran = {(M, key) for M, key in kept if times.get((M, key)) is not None}  # those whose compile did not fail
    assert ran <= set(screened) <= kept


def test_the_replay_refuses_to_time_a_config_never_compiled():
    times, cands, _ = recording("qwen3-30b-a3b-bf16")
    bench = ReplayBench(times)
    cfg = cands.ranked(1)[0]
    with pytest.raises(AssertionError, match="before it was compiled"):
        bench.time({1: [cfg]}, "screen")
    bench.compile([cfg])
    assert bench.time({1: [cfg]}, "screen")[1][0].ok


def test_the_command_offers_every_strategy_and_its_options():
    """`tune --strategy` reads its choices from STRATEGIES and `--option`'s help names each strategy's options,
    so a strategy added to the registry needs no second edit."""
    from moebench.cli.tune import tune as tune_command
    from moebench.tune.strategies import STRATEGIES

    params = {p.name: p for p in tune_command.params}
    assert list(params["strategy"].type.choices) == list(STRATEGIES)
    for name, module in STRATEGIES.items():
        assert f"{name}: {', '.join(module.Options.__dataclass_fields__)}" in params["options"].help


# --- moebench's kernel: the recorded H200 tunes of the default search --------------------------------------

OWN_RECORDED = Path(__file__).parent / "data" / "h200-own-tune"  # screens of results/h200-own-t*
# results/h200-own-tune-9b30689, then results/h200-own-tables-fca5ebb (compiles overlapped): each recording holds
# the screens the H200 made (the search with every hand-picked candidate a seed).
OWN_RECORDINGS = {
    "qwen3-30b-a3b-bf16": (lambda: get_model("qwen3-30b-a3b"), "bf16"),
    "deepseek-v3-tp8-fp8-block128": (lambda: shard(get_model("deepseek-v3"), tp=8), "fp8-block128"),
    "qwen3-30b-a3b-fp8-block128": (lambda: get_model("qwen3-30b-a3b"), "fp8-block128"),
    "mixtral-8x7b-bf16": (lambda: get_model("mixtral-8x7b"), "bf16"),  # 8 experts: few slots per expert
    "gpt-oss-20b-bf16": (lambda: get_model("gpt-oss-20b"), "bf16"),
}
H200 = DeviceLimits(sms=132, l2_bytes=60 * 2**20, smem_bytes=227 * 1024)  # as torch reports the H200's
OWN_GEOMEAN, OWN_WORST = 1.010, 1.03  # the default search's choice against the recorded best: over M, at each M


def own_replay(name: str, monkeypatch, rules=None):
    """The default search replayed without noise on a recording of moebench's kernel, with the known seeds of the
    H200's limits that ``rules`` keep (the seed rules by default): (recorded times, the bench, the choices)."""
    from moebench.tune import handpicked, seeds
    from moebench.tune.record import replay_rows

    monkeypatch.setattr(seeds, "interpreting", lambda: False)  # the seeds and candidates of a GPU
    monkeypatch.setattr(handpicked, "interpreting", lambda: False)
    times = replay_rows(OWN_RECORDED / f"{name}.jsonl.gz")
    shape, dtype = OWN_RECORDINGS[name][0](), OWN_RECORDINGS[name][1]
    problems = {M: Problem(shape, M, dtype) for M in sorted({M for M, _ in times})}
    known = seeds.known_seeds(get_path("triton"), problems, H200, *(() if rules is None else (rules,)))
    cands = Candidates(get_space("triton"), {M: Facts.of(p, "triton", H200) for M, p in problems.items()},
                       seeds=known)
    bench = Watched(times, noise=0.0)
    return times, bench, fast.search(cands, bench, fast.Options(**fast.PATH_DEFAULTS["triton"]))


@pytest.mark.parametrize("name", OWN_RECORDINGS)
def test_the_replay_of_an_h200_tune_of_moebenchs_kernel_screens_what_the_h200_screened(name, monkeypatch):
    """On the recorded screens, without noise, the search the H200 ran (the path's options, every hand-picked
    candidate a seed: no seed rules, the own-field rules, borrowing) asks for exactly the (M, config) screens the
    H200 tune made: the replay runs the search the GPU ran. (It chooses by screens where the GPU chose by final
    re-times.)"""
    times, bench, chosen = own_replay(name, monkeypatch, rules=())
    asked = [(M, key) for M, key, phase in bench.timed if phase == "screen"]
    assert len(asked) == len(set(asked))  # each (M, config) screened once
    assert set(asked) == {k for k, t in times.items() if t is not None}
    assert all(cfg is not None for cfg in chosen.values())


@pytest.mark.parametrize("name", OWN_RECORDINGS)
def test_the_default_search_screens_fewer_seeds_and_chooses_within_the_bound_of_the_recorded_best(name, monkeypatch):
    """With the seed rules (``seeds.SEED_RULES``) the default search screens each (M, config) once, fewer in
    all than the H200 made (the recording's screens: the budget it must stay under), and compiles fewer
    configs; its choice at each M is within OWN_WORST of the recorded best (OWN_GEOMEAN over M). A screen the
    recording lacks (a climb from another leader) counts as a failure, so the bound holds on what the H200
    timed."""
    times, bench, chosen = own_replay(name, monkeypatch)
    asked = [(M, key) for M, key, phase in bench.timed if phase == "screen"]
    recorded = {k for k, t in times.items() if t is not None}  # the screens the H200 made
    assert len(asked) == len(set(asked)) < len(recorded)
    assert len(bench.compiled) < len({key for _, key in times})  # the configs the H200 compiled
    best = {M: min(t for (m, _), t in times.items() if m == M and t is not None) for M in chosen}
    ratios = {M: times[(M, cfg.key())] / best[M] for M, cfg in chosen.items()}
    M = max(ratios, key=ratios.get)
    assert ratios[M] <= OWN_WORST, f"M={M}: {ratios[M]:.4f}x the recorded best"
    assert math.prod(ratios.values()) ** (1 / len(ratios)) <= OWN_GEOMEAN
