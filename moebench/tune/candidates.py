"""Per M, the configs of a declared space that the pruning rules keep, ranked by the cost model.

Strategies read the space only through ``Candidates``: ``ranked(M)`` (pruned, cheapest by the model first),
``allowed(M, cfg)``, and ``steps(cfg)``, the configs one step away along each dimension (the next value
down or up of an engine dimension; any other value of one of moebench's own fields), the moves of a local
search.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import cached_property

from moebench.errors import UserError
from moebench.tile import TileConfig
from moebench.tune.costmodel import H200, Machine, rank
from moebench.tune.prune import RULES, Facts, Rule, prune
from moebench.tune.space import Space


class Candidates:
    def __init__(self, space: Space, facts: Mapping[int, Facts], machine: Machine = H200,
                 rules: tuple[Rule, ...] = RULES):
        self.space, self.facts, self.machine, self.rules = space, dict(facts), machine, rules
        self.ms = tuple(sorted(self.facts))
        self._ranked: dict[int, list[TileConfig]] = {}
        self.dropped: dict[int, dict[str, int]] = {}

    def ranked(self, M: int) -> list[TileConfig]:
        if M not in self._ranked:
            kept, dropped = prune(self.space.engine_configs(), self.facts[M], self.rules)
            self._ranked[M] = rank(kept, self.facts[M], self.machine)
            self.dropped[M] = dropped
        return self._ranked[M]

    @cached_property
    def _allowed(self) -> dict[int, set[tuple]]:
        return {M: {c.key() for c in self.ranked(M)} for M in self.ms}

    def allowed(self, M: int, cfg: TileConfig) -> bool:
        """Whether ``cfg`` is in M's pruned space (moebench-only fields are checked by the rules' facts)."""
        if not any(getattr(cfg, d.name) != d.values[0] for d in self.space.own):
            return cfg.key() in self._allowed[M]
        base = replace(cfg, **{d.name: d.values[0] for d in self.space.own})
        return base.key() in self._allowed[M]

    def steps(self, cfg: TileConfig) -> list[TileConfig]:
        """Configs one step from ``cfg``: an engine dimension's next value down or up, or another value of one
        of the space's own fields (those ``TileConfig`` accepts)."""
        out = []
        for d in self.space.engine:
            i = d.values.index(getattr(cfg, d.name))
            for j in (i - 1, i + 1):
                if 0 <= j < len(d.values):
                    try:
                        out.append(replace(cfg, **{d.name: d.values[j]}))
                    except UserError:
                        pass
        out += list(self.space.neighbours(cfg))
        return out
