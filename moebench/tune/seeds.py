"""The configs a search starts from besides the cost model's first: per M, what is already known to run well.

For every path, its untuned default (``path.default_config``), so a tune screens what the path runs without a
table and chooses nothing slower by its screens. For moebench's kernel (``triton``), also the hand-picked
candidates (``handpicked.candidates``, which ``sweep --tune`` once ran one by one): the configs its H200 sweeps
found best, with the own fields the cost model does not rank. Seeds are screened at their own M only (they are
many per M and differ by M); the search's climb and its borrowing from neighbouring M carry a good seed further.
On the Triton interpreter only the default is a seed: its times say nothing of a GPU's, and each config costs
seconds there.
"""

from __future__ import annotations

from collections.abc import Mapping

from moebench._interpret import interpreting
from moebench.hardware import DeviceLimits
from moebench.problem import Problem
from moebench.tile import TileConfig
from moebench.tune.bench import unique

HANDPICKED_PATHS = ("triton",)  # the paths whose kernel the hand-picked candidates are written for


def known_seeds(path, problems: Mapping[int, Problem], limits: DeviceLimits) -> dict[int, list[TileConfig]]:
    """Per M: the path's default config, then (moebench's kernel) the hand-picked candidates, each once."""
    out = {}
    for M, problem in problems.items():
        seeds = [path.default_config(problem)]
        if path.name in HANDPICKED_PATHS and not interpreting():
            from moebench.tune.handpicked import candidates  # loads torch: only when a tune starts

            seeds += candidates(problem, limits=limits)
        out[M] = unique(seeds)
    return out
