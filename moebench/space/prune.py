"""Rules that drop configs of a declared space before anything is compiled, each unable to lose the best.

A rule drops a config only where running it cannot beat a config the space keeps:
- ``block-scale``: fp8-block128 scales one 128-wide K block per step; other steps are not runnable;
- ``shared-memory``: its pipelined operand tiles exceed a block's shared memory even one stage short
  (Triton could not compile it);
- ``registers``: its fp32 accumulators alone exceed the 255 registers a thread has, so they spill;
- ``tall-tile``: the token tile is over twice as tall as a busy expert's slots and taller than 64 (the
  wgmma tile height): a tile half as tall holds every such expert in one tile too, with the same programs
  and weight reads and less padding;
- ``same-order``: GROUP_SIZE_M at or above the grid's row tiles gives one program order whatever its
  value, so only the smallest such value is kept (the others are the same kernel run the same way).
Each rule is tested on its own and, on the recorded exhaustive H200 timings, never drops the best.

``OWN_RULES`` judge moebench's own fields of a config whose six engine fields the rules above keep:
- ``quant-x``: GEMM1 quantizing x is fp8-block128's (the kernel refuses it elsewhere);
- ``tma-rows``: TMA needs weight rows of a multiple of 16 bytes (refused elsewhere);
- ``split-full``: a split over K (GEMM1's or GEMM2's) where the unsplit grid already fills two waves of
  the SMs adds partial sums and no parallelism;
- ``direct-many``: a tile per slot where slots outnumber experts twice over reads most experts' weights
  twice or more, where one 16-row tile of the align step reads them once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from moebench.hardware import DeviceLimits
from moebench.kernels.align import max_padded_len
from moebench.problem import Problem
from moebench.space.declared import group_values
from moebench.tile import TileConfig, busy_slots

MAX_ACC_REGS = 255  # registers a thread may hold


@dataclass(frozen=True)
class Facts:
    """What the rules read of a problem, a kernel and the device: plain numbers."""

    kernel: str  # the path name: "triton-classic" or "triton"
    M: int
    experts: int
    topk: int
    hidden: int
    intermediate: int
    operand_bytes: int  # bytes per element of the GEMMs' operands (1 at fp8)
    block128: bool  # fp8 with 128x128 block scales
    smem_bytes: int
    sms: int = 132

    @classmethod
    def of(cls, problem: Problem, kernel: str, limits: DeviceLimits) -> Facts:
        s, spec = problem.shape, problem.spec
        return cls(kernel, problem.M, s.experts, s.topk, s.hidden, s.intermediate, spec.weight_bytes,
                   spec.fp8_scheme == "block128", limits.smem_bytes, limits.sms)

    @property
    def slots(self) -> int:
        return self.M * self.topk

    @property
    def busy(self) -> float:
        """A busy expert's slots under uniform routing (``tile.busy_slots``)."""
        return busy_slots(self.slots / self.experts)

    def row_tiles(self, cfg: TileConfig) -> int:
        """The grids' row tiles: the align step's bound, or a tile per slot."""
        if cfg.direct_route:
            return self.slots
        return max_padded_len(self.slots, self.experts, cfg.BLOCK_SIZE_M) // cfg.BLOCK_SIZE_M

    @property
    def b_tiles(self) -> int:
        """Weight tiles per K step of GEMM1: one in the engines' form, gate and up in moebench's."""
        return 1 if self.kernel == "triton-classic" else 2


def _pow2_at_least(v: float) -> int:
    p = 16
    while p < v:
        p *= 2
    return p


def block_scale(cfg: TileConfig, f: Facts) -> bool:
    if not f.block128:
        return False
    if f.kernel == "triton-classic":
        return 128 % cfg.BLOCK_SIZE_K != 0  # a step within one scale block
    return cfg.BLOCK_SIZE_K != 128  # moebench's kernel: one scale block per step


def shared_memory(cfg: TileConfig, f: Facts) -> bool:
    per_stage = (cfg.BLOCK_SIZE_M + f.b_tiles * cfg.BLOCK_SIZE_N) * cfg.BLOCK_SIZE_K * f.operand_bytes
    return per_stage * (cfg.num_stages - 1) > f.smem_bytes


def registers(cfg: TileConfig, f: Facts) -> bool:
    acc = f.b_tiles * cfg.BLOCK_SIZE_M * cfg.BLOCK_SIZE_N // (32 * cfg.num_warps)
    return acc > MAX_ACC_REGS


def tall_tile(cfg: TileConfig, f: Facts) -> bool:
    if cfg.direct_route:
        return False
    return cfg.BLOCK_SIZE_M > max(64, 2 * _pow2_at_least(f.busy))


def same_order(cfg: TileConfig, f: Facts, groups: Iterable[int] | None = None) -> bool:
    rows = f.row_tiles(cfg)
    if cfg.GROUP_SIZE_M < rows:
        return False
    groups = group_values(f.kernel) if groups is None else groups  # the values the kernel's space searches
    smallest = min((g for g in groups if g >= rows), default=cfg.GROUP_SIZE_M)
    return cfg.GROUP_SIZE_M > smallest


@dataclass(frozen=True)
class Rule:
    name: str
    drops: Callable[[TileConfig, Facts], bool]


RULES = (Rule("block-scale", block_scale), Rule("shared-memory", shared_memory), Rule("registers", registers),
         Rule("tall-tile", tall_tile), Rule("same-order", same_order))


def quant_x(cfg: TileConfig, f: Facts) -> bool:
    return cfg.gemm1_quant_x and not f.block128


def tma_rows(cfg: TileConfig, f: Facts) -> bool:
    return cfg.gemm1_tma and (f.hidden * f.operand_bytes) % 16 != 0


def split_full(cfg: TileConfig, f: Facts) -> bool:
    touched = min(f.experts, f.slots)  # row tiles at least (as handpicked.split_for counts them)
    gemm1 = touched * -(-f.intermediate // cfg.BLOCK_SIZE_N)
    gemm2 = max(touched, -(-f.slots // cfg.BLOCK_SIZE_M)) * -(-f.hidden // cfg.block_n2)
    return (cfg.split_k > 1 and gemm1 >= 2 * f.sms) or (cfg.gemm2_split_k > 1 and gemm2 >= 2 * f.sms)


def direct_many(cfg: TileConfig, f: Facts) -> bool:
    return cfg.direct_route and f.slots > 2 * f.experts


OWN_RULES = (Rule("quant-x", quant_x), Rule("tma-rows", tma_rows), Rule("split-full", split_full),
             Rule("direct-many", direct_many))
OWN_RUNNABLE = OWN_RULES[:2]  # the rules that drop only what the kernel refuses (kept without pruning)


def prune(configs: Iterable[TileConfig], facts: Facts,
          rules: tuple[Rule, ...] = RULES) -> tuple[list[TileConfig], dict[str, int]]:
    """The configs no rule drops, and how many each rule dropped (the first rule that drops a config)."""
    kept, dropped = [], {r.name: 0 for r in rules}
    for cfg in configs:
        rule = next((r for r in rules if r.drops(cfg, facts)), None)
        if rule is None:
            kept.append(cfg)
        else:
            dropped[rule.name] += 1
    return kept, dropped
