"""The configs a search starts from besides the cost model's first: per M, what is already known to run well.

For every path, its untuned default (``path.default_config``), so a tune screens what the path runs without a
table and chooses nothing slower by its screens. For moebench's kernel (``triton``), also the hand-picked
candidates (``handpicked.candidates``, which ``sweep --tune`` once ran one by one): the configs its H200 sweeps
found best, with the own fields the cost model does not rank. Seeds are screened at their own M only (they are
many per M and differ by M); the search's climb and its borrowing from neighbouring M carry a good seed further.
On the Triton interpreter only the default is a seed: its times say nothing of a GPU's, and each config costs
seconds there.

Screens of the seeds are most of a tune's screens, so a hand-picked variant that cannot change which tile wins is
not a seed where its plain twin is (``SEED_RULES``): the twin is one own-field step away, and the climb takes
that step from each M's leader (``Candidates.steps``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from moebench._interpret import interpreting
from moebench.hardware import DeviceLimits
from moebench.problem import Problem
from moebench.tile import TileConfig
from moebench.workers.bench import unique

HANDPICKED_PATHS = ("triton",)  # the paths whose kernel the hand-picked candidates are written for


# ---- the hand-picked variants left to the climb ----

def float32_sum(cfg: TileConfig) -> TileConfig | None:
    """The top-k sum's atomics into a float32 buffer: the same atomics as into the output's own dtype
    (``atomic_out``) at up to twice the bytes, and a launch that casts the buffer to the output. It is the form
    that adds in float32, not a faster one. Twin: the sum into the output."""
    return replace(cfg, atomic_out=True) if cfg.atomic_sum and not cfg.atomic_out else None


def swap_tall(cfg: TileConfig) -> TileConfig | None:
    """Swap-AB with a token tile of 64 rows or more: Swap-AB puts the expert's weight rows on the MMA's 64-row
    side, which pays where the token tile is shorter than that side and would leave it part empty; a tile of
    64 rows fills it already. Twin: the unswapped tile."""
    return replace(cfg, swap_ab=False) if cfg.swap_ab and cfg.BLOCK_SIZE_M >= 64 else None


def quant_x_in_gemm1(cfg: TileConfig) -> TileConfig | None:
    """GEMM1 quantizing x itself (fp8-block128, a tile per slot): it moves x's quantization into the K loop,
    which saves a launch and repeats the work in each program, so it pays or costs by the K steps a program
    walks (the split the leader already has), beside the same tiles. Twin: x quantized by its launch."""
    return replace(cfg, gemm1_quant_x=False) if cfg.gemm1_quant_x else None


@dataclass(frozen=True)
class SeedRule:
    name: str
    twin: Callable[[TileConfig], TileConfig | None]  # the plain twin of a variant not seeded; None: not one


SEED_RULES = (SeedRule("float32-sum", float32_sum), SeedRule("swap-tall", swap_tall),
              SeedRule("quant-x", quant_x_in_gemm1))


def seeded(candidates: list[TileConfig], rules: tuple[SeedRule, ...] = SEED_RULES) -> list[TileConfig]:
    """The candidates no rule leaves to the climb: a candidate is left out where a rule names it a variant and
    its twin is a candidate too (so a candidate without its twin, as the float32 sum on the interpreter, stays)."""
    keys = {c.key() for c in candidates}
    return [c for c in candidates
            if not any((twin := r.twin(c)) is not None and twin.key() in keys for r in rules)]


def known_seeds(path, problems: Mapping[int, Problem], limits: DeviceLimits,
                rules: tuple[SeedRule, ...] = SEED_RULES) -> dict[int, list[TileConfig]]:
    """Per M: the path's default config, then (moebench's kernel) the hand-picked candidates ``rules`` keep
    (``seeded``), each once."""
    out = {}
    for M, problem in problems.items():
        seeds = [path.default_config(problem)]
        if path.name in HANDPICKED_PATHS and not interpreting():
            from moebench.tune.handpicked import candidates  # loads torch: only when a tune starts

            seeds += seeded(candidates(problem, limits=limits), rules)
        out[M] = unique(seeds)
    return out
