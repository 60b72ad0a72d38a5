"""Per M, the configs of a declared space that the pruning rules keep, ranked by the cost model.

Strategies read the space only through ``Candidates``: ``ranked(M)`` (pruned, cheapest by the model first),
``seeds(M)`` (configs known to run well there: ``tune.seeds``, those the rules keep), ``allowed(M, cfg)``, and
``steps(cfg)``, the configs one step away along each dimension (the next value
down or up of an engine dimension; any other value of one of moebench's own fields), the moves of a local
search.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cached_property

from moebench.errors import UserError
from moebench.space.declared import Space
from moebench.space.prune import OWN_RULES, RULES, Facts, Rule, prune
from moebench.tile import TileConfig
from moebench.tune.costmodel import H200, Machine, rank


class Candidates:
    def __init__(self, space: Space, facts: Mapping[int, Facts], machine: Machine = H200,
                 rules: tuple[Rule, ...] = RULES, seeds: Mapping[int, Sequence[TileConfig]] | None = None,
                 own_rules: tuple[Rule, ...] = OWN_RULES):
        self.space, self.facts, self.machine, self.rules = space, dict(facts), machine, rules
        self.own_rules = own_rules
        self._seeds = {M: list(cs) for M, cs in (seeds or {}).items()}
        self.ms = tuple(sorted(self.facts))
        self._ranked: dict[int, list[TileConfig]] = {}
        self.dropped: dict[int, dict[str, int]] = {}

    def ranked(self, M: int) -> list[TileConfig]:
        if M not in self._ranked:
            kept, dropped = prune(self.space.engine_configs(), self.facts[M], self.rules)
            self._ranked[M] = rank(kept, self.facts[M], self.machine)
            self.dropped[M] = dropped
        return self._ranked[M]

    def seeds(self, M: int) -> list[TileConfig]:
        """The configs given as known to run well at M (none by default), those the rules keep."""
        return [c for c in self._seeds.get(M, ()) if self.allowed(M, c)]

    @cached_property
    def _allowed(self) -> dict[int, set[tuple]]:
        return {M: {c.key() for c in self.ranked(M)} for M in self.ms}

    def allowed(self, M: int, cfg: TileConfig) -> bool:
        """Whether ``cfg`` is in M's pruned space: its engine fields kept by the rules, its moebench-only fields
        by the own rules."""
        if not any(getattr(cfg, d.name) != d.values[0] for d in self.space.own):
            return cfg.key() in self._allowed[M]
        base = replace(cfg, **{d.name: d.values[0] for d in self.space.own})
        return base.key() in self._allowed[M] and not any(r.drops(cfg, self.facts[M]) for r in self.own_rules)

    def steps(self, cfg: TileConfig) -> list[TileConfig]:
        """Configs one step from ``cfg``: an engine dimension's next value down or up, or another value of one
        of the space's own fields (those ``TileConfig`` accepts)."""
        out = []
        for d in self.space.engine:
            if getattr(cfg, d.name) not in d.values:
                continue  # a seed's value the space does not search: no step along it
            i = d.values.index(getattr(cfg, d.name))
            for j in (i - 1, i + 1):
                if 0 <= j < len(d.values):
                    try:
                        out.append(replace(cfg, **{d.name: d.values[j]}))
                    except UserError:
                        pass
        out += list(self.space.neighbours(cfg))
        return out
