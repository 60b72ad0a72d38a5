"""Exhaustive search: every config the pruning rules keep, screened at every M, the best few re-timed.

The reference the fast strategy is checked against: it compiles the union of the pruned spaces and times
each config at each M where the rules keep it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from moebench.tune.strategies.ranges import MAX_COUNT, check_ranges
from moebench.workers.bench import Bench, fastest

if TYPE_CHECKING:  # annotations only: the registry, read by --strategy, loads no torch
    from moebench.tune.candidates import Candidates


@dataclass(frozen=True)
class Options:
    final: int = 4  # configs per M re-timed at the final budget, best screen times first
    limit: int = 0  # at most this many configs per M, the model's first (0: all); for small checks

    def __post_init__(self) -> None:
        check_ranges("exhaustive", self, {"final": (1, MAX_COUNT), "limit": (0, MAX_COUNT)})


def search(cands: Candidates, bench: Bench, opts: Options = Options()) -> dict:
    per_m = {M: cands.ranked(M)[:opts.limit or None] for M in bench.ms}
    _, screens = bench.compile_and_time(per_m, "screen")
    finals = bench.time({M: [t.config for t in fastest(ts, opts.final)] for M, ts in screens.items()}, "final")
    return {M: (best[0].config if (best := fastest(ts)) else None) for M, ts in finals.items()}
