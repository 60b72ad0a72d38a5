"""The hand-picked tile-config candidates of one point: what ``isa`` tries and, less the variants ``tune.seeds``
leaves to the climb (``SEED_RULES``), the tune's known seeds.

The token tile height follows the average slots per expert (``M * topk / E``),
as in ``tile.default_config``; around it a handful of shapes that do well on
Hopper for grouped GEMMs are tried, each with and without Swap-AB and with the
three forms of the top-k sum. Each moebench-only field (``tile.FIELDS``) is
tried where a rule below says it can pay off, beside the config without it, so
a sweep measures both and keeps the fastest. The rules that depend on the GPU
read its SM count, L2 and shared memory from ``hardware.DeviceLimits``. Each
candidate is checked against the reference before it is timed (``bench.sweep``
does that).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import torch

from moebench._interpret import interpreting
from moebench.dtypes import DtypeSpec
from moebench.hardware import DeviceLimits
from moebench.problem import Problem
from moebench.tile import TileConfig, busy_slots, fit_stages, tma_rows

T = TileConfig
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages) per class of slots per expert.
_DECODE = (T(16, 64, 128, 1, 4, 4), T(16, 128, 128, 1, 4, 3), T(16, 64, 256, 1, 4, 3), T(16, 32, 256, 1, 4, 4))
_SMALL = (T(32, 64, 128, 1, 4, 4), T(32, 128, 128, 1, 4, 3), T(16, 64, 128, 1, 4, 4), T(64, 64, 128, 1, 4, 3))
_MID = (T(64, 64, 64, 8, 4, 4), T(64, 128, 64, 8, 4, 4), T(64, 128, 128, 8, 4, 3), T(128, 64, 64, 8, 4, 4))
# Prefill: no 128x256 tile (the slowest GEMM1 tile at every point); 64x64 also at 3 stages, which keeps its
# fp8-block128 operand tiles in 72 KB of shared memory, not 96 KB.
_LARGE = (T(128, 128, 64, 8, 8, 3), T(128, 128, 64, 8, 8, 4), T(64, 256, 64, 8, 8, 3), T(64, 128, 64, 8, 4, 4),
          T(64, 64, 64, 8, 4, 4), T(64, 64, 64, 8, 4, 3))
# The most slots per expert of the decode, small and mid classes; above MID_MAX, prefill (_LARGE).
DECODE_MAX, SMALL_MAX, MID_MAX = 16, 48, 192


def _classes(per_expert: float) -> tuple[TileConfig, ...]:
    if per_expert <= DECODE_MAX:
        return _DECODE
    if per_expert <= SMALL_MAX:
        return _SMALL
    if per_expert <= MID_MAX:
        return _MID
    return _LARGE


# Each class with the row-tile height most of its shapes have, lowest first (``_shapes``).
_HEIGHTS = ((16, _DECODE), (32, _SMALL), (64, _MID), (128, _LARGE))


def _shapes(per_expert: float) -> tuple[TileConfig, ...]:
    """The class shapes to try: those of the average slots per expert and, where another class's tiles are
    the lowest that hold a busy expert's slots (``tile.busy_slots``) in one row tile, those too: with uniform
    routing many experts get more than the average, and a second row tile reads their weights again. Above
    128 no tile holds a busy expert, so nothing is added."""
    busy = busy_slots(per_expert)
    holding = next((shapes for height, shapes in _HEIGHTS if busy <= height), ())
    return tuple(dict.fromkeys(_classes(per_expert) + holding))


def split_for(problem: Problem, cfg: TileConfig, limits: DeviceLimits | None = None) -> int:
    """A GEMM1 split-K factor that gives about two programs per SM, or 1 when the grid is full enough.

    GEMM1 runs (experts touched, at most M * topk) x cdiv(I, BLOCK_N) programs; each split
    keeps at least two K steps. ``limits``: the current device's if not given.
    """
    s = problem.shape
    programs = min(s.experts, problem.M * s.topk) * -(-s.intermediate // cfg.BLOCK_SIZE_N)
    return _split_to_fill(programs, -(-s.hidden // cfg.BLOCK_SIZE_K), (limits or DeviceLimits.current()).sms)


def gemm2_split_for(problem: Problem, cfg: TileConfig, limits: DeviceLimits | None = None) -> int:
    """A GEMM2 split-K factor (``gemm2_split_k``) that gives about two programs per SM, or 1 when GEMM2's
    grid is full enough, as ``split_for`` does for GEMM1: GEMM2 runs (row tiles: at least the experts
    touched) x cdiv(hidden, its BLOCK_N) programs, each over cdiv(I, BLOCK_K) steps; each split keeps at
    least two. At decode with few experts touched one program per SM would stream its expert's rows alone."""
    s = problem.shape
    slots = problem.M * s.topk
    row_tiles = max(min(s.experts, slots), -(-slots // cfg.BLOCK_SIZE_M))
    programs = row_tiles * -(-s.hidden // cfg.block_n2)
    k_steps = -(-s.intermediate // cfg.BLOCK_SIZE_K)
    return _split_to_fill(programs, k_steps, (limits or DeviceLimits.current()).sms)


def _split_to_fill(programs: int, k_steps: int, sms: int) -> int:
    """The power-of-two split of ``programs`` programs of ``k_steps`` K steps each that gives about two
    programs per SM, each split keeping at least two steps (1 when the grid is full enough)."""
    split = 1
    while programs * split < 2 * sms and split * 2 <= k_steps // 2:
        split *= 2
    return split


def _for_dtype(base: TileConfig, spec: DtypeSpec) -> TileConfig:
    """The class shape adapted to the dtype: fp8 steps over twice the K; fp8-block128 over one scale block."""
    if spec.fp8_scheme != "block128":
        if spec.is_fp8 and base.BLOCK_SIZE_K < 128:
            return replace(base, BLOCK_SIZE_K=2 * base.BLOCK_SIZE_K)  # same bytes per step as bf16
        return base
    cfg = replace(base, BLOCK_SIZE_K=128)  # one weight-scale block per K step
    if cfg.BLOCK_SIZE_M * cfg.BLOCK_SIZE_N >= 64 * 128:
        cfg = replace(cfg, num_warps=8)  # per-step scaling keeps two more tiles live: 4 warps spill registers
    return cfg


def candidates(problem: Problem, swap_ab: tuple[bool, ...] = (False, True),
               limits: DeviceLimits | None = None) -> list[TileConfig]:
    """Distinct configs to try for ``problem``, fitted to the shared memory of ``limits`` (the current
    device's if not given): the class's shapes (and a busy expert's class's) x Swap-AB x the top-k sum's
    forms x GEMM1 split-K where its grid is small x a tile per slot where slots are few against experts x
    GEMM2's width and column walk x row tiles per group; beside each, the variants the ``_tries_*`` rules
    select (GEMM2 split-K, merged GEMM1, GEMM1 by TMA, GEMM2 columns first, x quantized by GEMM1, GEMM2
    preload, tail tiles)."""
    limits = limits or DeviceLimits.current()
    s, spec = problem.shape, problem.spec
    per_expert = problem.M * s.topk / s.routed_experts  # under an expert_map, slots per global expert
    # A tile per slot reads an expert's weights once per slot routed to it, so only where few slots share
    # an expert: with uniform routing about T / 2E of the T slots do, at most 1 in 8 here.
    direct = (False, True) if 4 * problem.M * s.topk <= s.routed_experts else (False,)
    out: dict[tuple, TileConfig] = {}
    for base in _shapes(per_expert):
        cfg = fit_stages(_for_dtype(base, spec), spec.weight_bytes, limits)
        splits = sorted({1, split_for(problem, cfg, limits)})
        split2 = gemm2_split_for(problem, cfg, limits)
        widths = _gemm2_widths(cfg, spec, per_expert)
        walks = _gemm2_walks(cfg, s.intermediate, per_expert)
        groups = _groups(cfg, per_expert)
        for swap, (atomic, into_out), split, route, n2, walk, group in product(
                swap_ab, _sum_forms(spec), splits, direct, widths, walks, groups):
            if route and group != cfg.GROUP_SIZE_M:
                continue  # a tile per slot: no two row tiles share an expert's weights through grouping
            c = replace(cfg, swap_ab=swap, atomic_sum=atomic, atomic_out=into_out, split_k=split, direct_route=route,
                        gemm2_block_n=n2, gemm2_n_tiles=walk, GROUP_SIZE_M=group)
            # GEMM2 split-K adds its partial sums by the atomic sum, one column tile per program.
            gemm2_forms = (c, replace(c, gemm2_split_k=split2)) if atomic and split2 > 1 and walk == 1 else (c,)
            for form in gemm2_forms:
                out.setdefault(form.key(), form)
            if _tries_merged(c, spec):
                merged = replace(c, gemm1_merged=True)
                out.setdefault(merged.key(), merged)
            tma = (replace(c, gemm1_tma=True),) if _tries_tma(c, spec, per_expert, s.hidden) else ()
            # GEMM2's column chunks first, beside the TMA form and the plain one.
            chunked = (*tma, c) if _tries_columns_first(c, problem, limits) else ()
            for form in tma + tuple(replace(g1, gemm2_columns_first=True) for g1 in chunked):
                out.setdefault(form.key(), form)
            if route and spec.fp8_scheme == "block128":
                # GEMM1 quantizing x itself pays where a program walks few K steps and costs where it walks
                # many, so it is tried beside every GEMM2 form of a tile per slot.
                for form in gemm2_forms:
                    quant_x = replace(form, gemm1_quant_x=True)
                    out.setdefault(quant_x.key(), quant_x)
    for c in [c for c in out.values() if _tries_preload(c, spec)]:
        preload = replace(c, gemm2_preload=True)
        out.setdefault(preload.key(), preload)
    for c in [c for c in out.values() if _tries_tail(c, spec, per_expert)]:
        tail = replace(c, tail_tiles=1)
        out.setdefault(tail.key(), tail)
    return list(out.values())


def _tries_tail(cfg: TileConfig, spec: DtypeSpec, per_expert: float) -> bool:
    """Whether to try an expert's last row tile at half the rows where its slots fit (``tail_tiles`` = 1).
    The align step pads each expert to whole row tiles; a half-height tail pads less but still reads its
    whole weight tile, so it can pay only with 128-row tiles. At fp8 it is tried only where a 128-row tile
    holds a busy expert (many experts' one tile is then a tail), and never at fp8-block128, whose best tiles
    are 64 rows high."""
    if cfg.BLOCK_SIZE_M != 128 or cfg.direct_route:
        return False
    return not spec.is_fp8 or (spec.fp8_scheme != "block128" and busy_slots(per_expert) <= 128)


def _tries_preload(cfg: TileConfig, spec: DtypeSpec) -> bool:
    """Whether to try GEMM2 reading its first two K steps' weights before it waits for GEMM1
    (``gemm2_preload``; a tile per slot, one column tile per program). Only at fp8: at bf16 the two tiles
    held in registers are twice the bytes."""
    return spec.is_fp8 and cfg.direct_route and cfg.gemm2_n_tiles == 1


def _sum_forms(spec: DtypeSpec) -> tuple[tuple[bool, bool], ...]:
    """(atomic_sum, atomic_out) of the top-k sum's forms to try: atomics into a float32 buffer, atomics into
    the output itself (no buffer to zero and cast, at the cost of additions in the output's dtype, in no
    fixed order), stored rows. The interpreter has no bf16 atomics, so there the output form is not tried
    for bf16 activations."""
    if interpreting() and spec.act == torch.bfloat16:
        return ((True, False), (False, False))
    return ((True, False), (True, True), (False, False))


def _groups(cfg: TileConfig, per_expert: float) -> tuple[int, ...]:
    """GROUP_SIZE_M values to try. A class shape with GROUP_SIZE_M = 1 runs every column tile of one row
    tile before the next row tile, so an expert with two row tiles reads its weights from DRAM twice;
    with 8 row tiles per group the second read of each weight tile follows the first, from L2. With
    uniform routing an expert needs a second tile when it gets more than BLOCK_SIZE_M slots, common once
    the average reaches half a tile."""
    if cfg.GROUP_SIZE_M == 1 and per_expert > cfg.BLOCK_SIZE_M / 2:
        return (1, 8)
    return (cfg.GROUP_SIZE_M,)


def _tries_merged(cfg: TileConfig, spec: DtypeSpec) -> bool:
    """Whether to try GEMM1 as one MMA per K step over gate and up rows together (``gemm1_merged``): it pays
    for 8-warp tiles without Swap-AB, and not with per-step block scaling."""
    return cfg.num_warps == 8 and not cfg.swap_ab and spec.fp8_scheme != "block128"


def _tries_columns_first(cfg: TileConfig, problem: Problem, limits: DeviceLimits) -> bool:
    """Whether to try GEMM2 running every row tile of a column chunk before the next
    (``gemm2_columns_first``), so the rows its atomics add into are those of one chunk at a time. Where the
    sum [M, hidden] is larger than L2 and GEMM2 walks the row tiles first, the atomics of each token's top-k
    slots come far apart and its row leaves L2 in between."""
    sum_bytes = problem.M * problem.shape.hidden * (problem.spec.act.itemsize if cfg.atomic_out else 4)
    return cfg.atomic_sum and cfg.gemm2_split_k == 1 and sum_bytes > limits.l2_bytes


def _tries_tma(cfg: TileConfig, spec: DtypeSpec, per_expert: float, hidden: int) -> bool:
    """Whether to try GEMM1 reading its weight tiles by TMA (``gemm1_tma``): at fp8 with the align step and
    16 or more slots per expert, only without Swap-AB (so the candidates grow by half, not double) or the
    merged MMA. TMA needs rows of a multiple of 16 bytes."""
    return (spec.is_fp8 and per_expert >= DECODE_MAX and not cfg.swap_ab and not cfg.gemm1_merged
            and not cfg.direct_route and tma_rows(hidden, spec.weight_bytes))


def _gemm2_widths(cfg: TileConfig, spec: DtypeSpec, per_expert: float) -> tuple[int, ...]:
    """GEMM2 tile widths to try besides GEMM1's (0): at fp8-block128 prefill, 128 columns for 64-wide tiles;
    at bf16 and fp8-tensor prefill, 256 for 128-wide tiles at 8 warps (its activation tile read from L2 half
    as often)."""
    if spec.fp8_scheme == "block128" and per_expert > SMALL_MAX and cfg.BLOCK_SIZE_N == 64:
        return (0, 128)
    if spec.fp8_scheme != "block128" and per_expert > MID_MAX and cfg.BLOCK_SIZE_N == 128 and cfg.num_warps == 8:
        return (0, 256)
    return (0,)


def _gemm2_walks(cfg: TileConfig, intermediate: int, per_expert: float) -> tuple[int, ...]:
    """GEMM2 column tiles per program to try. With K (the intermediate size) at most two K steps, a program
    of one tile ends before its loads could run ahead: walking 8 tiles in one loop lets them, and 4 at decode
    keep more programs than SMs. With up to 8 steps, 4 tiles are tried at 64 or more slots per expert."""
    k_steps = -(-intermediate // cfg.BLOCK_SIZE_K)
    if k_steps > 2:
        return (1, 4) if k_steps <= 8 and per_expert >= 64 else (1,)
    return (1, 8) if per_expert >= 2 else (1, 4)
