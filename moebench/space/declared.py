"""The declared search space of each tunable kernel: every dimension it exposes, with its values, in one place.

``SPACES`` maps a path name to its ``Space``. The engines' form (``triton-classic``) exposes the six
parameters vLLM's and SGLang's kernels read, over the ranges vLLM's own tuner searches (1,920 configs).
moebench's kernel (``triton``) exposes the same six and each moebench-only field of ``tile.FIELDS``; its
product is far too large to enumerate, so strategies search it in two stages (``staged``): the six first,
then the moebench-only fields around the best few. A combination ``TileConfig`` refuses is not in the space.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import product
from math import prod

from moebench.errors import UserError
from moebench.tile import FIELD, TileConfig

# vLLM's tuner's batch sizes: the keys of the tables it ships, and the M a tune covers by default.
VLLM_MS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)


@dataclass(frozen=True)
class Dim:
    """One dimension of a search space: a ``TileConfig`` field and the values searched."""

    name: str
    values: tuple
    why: str  # why these values

    def __post_init__(self) -> None:
        if self.name not in FIELD:
            raise ValueError(f"search dimension {self.name!r} is not a TileConfig field")
        if not self.values:
            raise ValueError(f"search dimension {self.name!r} has no values")


# The six engine parameters over the ranges vLLM's benchmark_moe.py searches.
ENGINE_DIMS = (
    Dim("BLOCK_SIZE_M", (16, 32, 64, 128, 256), "token-slot rows: 16 (decode) up to 256 (prefill)"),
    Dim("BLOCK_SIZE_N", (32, 64, 128, 256), "output columns per tile"),
    Dim("BLOCK_SIZE_K", (64, 128, 256), "reduction step"),
    Dim("GROUP_SIZE_M", (1, 16, 32, 64), "row tiles visited together for L2 reuse of weights"),
    Dim("num_warps", (4, 8), "one or two warpgroups"),
    Dim("num_stages", (2, 3, 4, 5), "software-pipeline depth of the K loop"),
)

# moebench's kernel: the same six, GROUP_SIZE_M also at 8 (the L2 grouping its best known prefill configs use).
OWN_ENGINE_DIMS = tuple(Dim(d.name, (1, 8, 16, 32, 64), d.why) if d.name == "GROUP_SIZE_M" else d
                        for d in ENGINE_DIMS)

# moebench's own fields, each from its off position (the default) to the values its kernel runs.
OWN_DIMS = (
    Dim("swap_ab", (False, True), "the expert dimension on the MMA's 64-row side"),
    Dim("atomic_sum", (True, False), "top-k sum by atomics, or rows stored then summed"),
    Dim("atomic_out", (False, True), "atomics into the output's own dtype"),
    Dim("split_k", (1, 2, 4, 8, 16), "GEMM1 split over K where its grid is small"),
    Dim("gemm2_split_k", (1, 2, 4, 8), "GEMM2 split over K"),
    Dim("direct_route", (False, True), "a tile per slot, no align step"),
    Dim("gemm2_block_n", (0, 64, 128, 256), "GEMM2's own tile width (0: BLOCK_SIZE_N)"),
    Dim("gemm2_n_tiles", (1, 4, 8), "GEMM2 column tiles per program"),
    Dim("gemm1_merged", (False, True), "one MMA over gate and up rows"),
    Dim("gemm1_quant_x", (False, True), "GEMM1 quantizes x (fp8-block128, direct_route)"),
    Dim("gemm1_tma", (False, True), "GEMM1 weight tiles by TMA"),
    Dim("gemm2_columns_first", (False, True), "GEMM2 column chunks first"),
    Dim("gemm2_preload", (False, True), "GEMM2 preloads two K steps of weights"),
    Dim("tail_tiles", (0, 1, 2), "a shorter last row tile per expert"),
)


@dataclass(frozen=True)
class Space:
    """A kernel's declared search space: ``engine`` dimensions searched as a product, then ``own`` ones."""

    kernel: str  # the path name
    engine: tuple[Dim, ...]
    own: tuple[Dim, ...] = ()

    @property
    def dims(self) -> tuple[Dim, ...]:
        return self.engine + self.own

    @property
    def size(self) -> int:
        """Points of the full product (before ``TileConfig`` refuses combinations and before pruning)."""
        return prod(len(d.values) for d in self.dims)

    def engine_configs(self) -> Iterator[TileConfig]:
        """Every config of the engine dimensions' product, moebench-only fields off."""
        names = [d.name for d in self.engine]
        for values in product(*(d.values for d in self.engine)):
            yield TileConfig(**dict(zip(names, values)))

    def neighbours(self, cfg: TileConfig) -> Iterator[TileConfig]:
        """Configs that differ from ``cfg`` in one own dimension (each other value), those ``TileConfig``
        accepts: the steps of the second stage."""
        for d in self.own:
            for v in d.values:
                if v == getattr(cfg, d.name):
                    continue
                try:
                    yield TileConfig(**{**cfg.as_dict(), d.name: v})
                except UserError:
                    continue

    def describe(self) -> list[dict]:
        """The dimensions as rows (name, values, why), for ``moebench tune --show-space`` and the run's meta."""
        return [{"name": d.name, "values": list(d.values), "stage": "engine" if d in self.engine else "own",
                 "why": d.why} for d in self.dims]


SPACES: dict[str, Space] = {
    "triton-classic": Space("triton-classic", ENGINE_DIMS),
    "triton": Space("triton", OWN_ENGINE_DIMS, OWN_DIMS),
}


def get_space(path: str) -> Space:
    try:
        return SPACES[path]
    except KeyError:
        raise UserError(f"no search space for path {path!r}; tunable: {', '.join(SPACES)}") from None


def group_values(path: str) -> tuple[int, ...]:
    """The GROUP_SIZE_M values ``path``'s space searches."""
    return next(d.values for d in get_space(path).engine if d.name == "GROUP_SIZE_M")
