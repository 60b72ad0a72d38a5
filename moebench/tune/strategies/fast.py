"""The default strategy: known seeds and the cost model's first few, screened, a local search from the
leaders, then the best few re-timed.

1. Seed: each M's known seeds (``Candidates.seeds``: the path's default and, for moebench's kernel, the
   hand-picked candidates), screened at that M, and the union over M of each M's first configs by the cost
   model, overall and per tile shape (``_seeds``). A config compiled once runs at every M (token counts are
   not specialized), so by default every model seed is screened at every M where the pruning rules keep it;
   with ``share=0`` each M screens only its own.
2. Climb: each M screens the configs one step from its ``lead`` fastest (``Candidates.steps``) and the
   ``borrow`` fastest of each neighbouring M, those not yet timed there; repeated ``climbs`` times for the M
   whose leaders, or whose neighbours' leaders, changed. The steps correct the model where it ranks a good
   config low; borrowing carries a config found at one M to the next, where it is often best too.
3. Final: each M's ``final`` fastest screens are re-timed at the final budget; the fastest is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from moebench.errors import UserError
from moebench.tune.strategies.ranges import MAX_COUNT, MAX_STEPS, check_ranges
from moebench.workers.bench import Bench, fastest, unique

if TYPE_CHECKING:  # annotations only: the registry, read by --strategy, loads no torch
    from moebench.tune.candidates import Candidates


@dataclass(frozen=True)
class Options:
    per_shape: int = 2  # per M and tile shape (BLOCK_SIZE_M x BLOCK_SIZE_N), the model's first configs
    top: int = 4  # per M, the model's first configs overall
    lead: int = 4  # per M, the fastest configs the climb steps from
    climbs: int = 5  # climb steps at most
    final: int = 4  # configs per M re-timed at the final budget
    share: int = 1  # 1: every model seed screened at every M; 0: each M screens its own seeds only
    borrow: int = 1  # per climb step, the fastest configs (at most lead) of each neighbouring M screened at M too

    def __post_init__(self) -> None:
        check_ranges("fast", self, {"per_shape": (0, MAX_COUNT), "top": (0, MAX_COUNT), "lead": (1, MAX_COUNT),
                                    "climbs": (0, MAX_STEPS), "final": (1, MAX_COUNT), "share": (0, 1),
                                    "borrow": (0, MAX_COUNT)})
        if self.top == 0 and self.per_shape == 0:
            raise UserError("strategy 'fast': options top=0 and per_shape=0 seed nothing (one of them 1 or more)")


# Per path, the defaults that differ from ``Options()``. moebench's kernel (``triton``) screens at 40-60 ms a
# config and M on an H200 (docs/tuning.md) and has 10-160 known seeds per M: each M screens its own seeds, the
# model's first two and one per tile shape, and climbs twice from its fastest (a borrow may be at most ``lead``).
PATH_DEFAULTS = {"triton": dict(top=2, per_shape=1, lead=1, climbs=2, share=0)}

# On the Triton interpreter a tune shows the workflow and checks what it runs, but its times are no GPU's: where
# no option is given (``moebench tune``, ``sweep --tune``) the search is cut to each M's seeds and the model's
# first config, no climb, one final re-time (a tiny shape at three M: about half a minute, not five).
INTERPRETER = (("top", 1), ("per_shape", 0), ("climbs", 0), ("final", 1))


def search(cands: Candidates, bench: Bench, opts: Options = Options()) -> dict:
    model = {M: unique(_seeds(cands.ranked(M), opts)) for M in bench.ms}
    shared = unique(c for M in bench.ms for c in model[M])
    first = {M: unique(cands.seeds(M) + (shared if opts.share else model[M])) for M in bench.ms}
    timed: dict[int, dict[tuple, object]] = {M: {} for M in bench.ms}  # M -> config key -> its screen
    failed: dict[tuple, object] = {}

    def screen(work):
        """Compile what ``work`` needs and screen it (overlapped where the bench can)."""
        new_failures, screens = bench.compile_and_time(work, "screen")
        failed.update(new_failures)
        for M, ts in screens.items():
            timed[M].update((t.config.key(), t) for t in ts)

    screen({M: [c for c in cs if cands.allowed(M, c)] for M, cs in first.items()})
    leaders = {M: fastest(timed[M].values(), opts.lead) for M in bench.ms}
    moved = set(bench.ms)  # the M whose leaders changed at the last step: they and their neighbours climb on
    for _ in range(opts.climbs):
        work = {}
        for M in (_with_neighbours(moved, bench.ms) if opts.borrow else sorted(moved)):
            near = {s.key(): s for t in leaders[M] for s in cands.steps(t.config)}
            near.update((t.config.key(), t.config) for n in _neighbours(M, bench.ms)
                        for t in leaders[n][:opts.borrow])
            fresh = [c for k, c in near.items() if k not in timed[M] and k not in failed and cands.allowed(M, c)]
            if fresh:
                work[M] = fresh
        if not work:
            break
        screen(work)
        new = {M: fastest(timed[M].values(), opts.lead) for M in bench.ms}
        moved = {M for M in bench.ms if [t.config.key() for t in new[M]] != [t.config.key() for t in leaders[M]]}
        leaders = new
    finals = bench.time({M: [t.config for t in fastest(timed[M].values(), opts.final)] for M in bench.ms}, "final")
    return {M: (best[0].config if (best := fastest(ts)) else None) for M, ts in finals.items()}


def _neighbours(M: int, ms: tuple[int, ...]) -> list[int]:
    i = ms.index(M)
    return [ms[j] for j in (i - 1, i + 1) if 0 <= j < len(ms)]


def _with_neighbours(moved: set[int], ms: tuple[int, ...]) -> list[int]:
    return [M for M in ms if M in moved or any(n in moved for n in _neighbours(M, ms))]


def _seeds(ranked: list, opts: Options) -> list:
    """The model's first ``top`` configs, and its first ``per_shape`` of each tile shape: the model ranks
    configs of one shape better than it ranks shapes, so every shape the rules keep is tried."""
    seeds, per = list(ranked[:opts.top]), {}
    for c in ranked:
        shape = (c.BLOCK_SIZE_M, c.BLOCK_SIZE_N)
        if per.get(shape, 0) < opts.per_shape:
            per[shape] = per.get(shape, 0) + 1
            seeds.append(c)
    return seeds

