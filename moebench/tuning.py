"""The tile-config search space: a small pruned list of candidates per problem.

The token tile height follows the average slots per expert (``M * topk / E``),
as in ``tile.default_config``; around it a handful of shapes that are known
to do well on Hopper for grouped GEMMs are tried, each with and without
Swap-AB and with the three forms of the top-k sum (atomics into a zeroed
float32 buffer and a cast after, atomics into the output itself, or stored
rows and one sum launch), so a sweep reports
them all and keeps the fastest; where GEMM1's grid would leave SMs idle, a
split-K variant is added. Each candidate is checked against the reference
before it is timed (the runner does that).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import torch

from moebench._interpret import interpreting
from moebench.dtypes import DtypeSpec
from moebench.problem import Problem
from moebench.tile import TileConfig, busy_slots, fit_stages, tma_rows

T = TileConfig
SMS = 132  # H100/H200 SXM multiprocessors: the grid size split-K aims to fill
L2_BYTES = 50 * 2**20  # H100/H200 SXM L2 cache
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages) per class of slots per expert.
_DECODE = (T(16, 64, 128, 1, 4, 4), T(16, 128, 128, 1, 4, 3), T(16, 64, 256, 1, 4, 3), T(16, 32, 256, 1, 4, 4))
_SMALL = (T(32, 64, 128, 1, 4, 4), T(32, 128, 128, 1, 4, 3), T(16, 64, 128, 1, 4, 4), T(64, 64, 128, 1, 4, 3))
_MID = (T(64, 64, 64, 8, 4, 4), T(64, 128, 64, 8, 4, 4), T(64, 128, 128, 8, 4, 3), T(128, 64, 64, 8, 4, 4))
# Prefill: per-GEMM profiles on an H200 (results/h200-gemm-split) had 128x256 slowest at every point
# (GEMM1 3-7x the best) and 64x64 / 64x256 fastest for the fp8-block128 / bf16 Qwen3 GEMM1.
# 64x64 also at 3 stages: at fp8-block128 its operand tiles take 72 KB of shared memory, not 96 KB,
# and it was 0-2% faster than 4 stages (results/h200-session3-ab).
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
    the lowest that hold a busy expert's slots (``tile.busy_slots``) in one row tile, those too. At 16 per
    expert (Mixtral M=64, Qwen3 M=256; busy 24) about 43% of the experts take a second 16-row tile; tuned on
    an H200 with the small class's tiles too, 32-row tiles made those points 1.04-1.19x faster. At 64 (Mixtral M=256,
    Qwen3 M=1024; busy 80) the prefill class's 128x128 tile made Mixtral 1.025-1.042x faster and Qwen3 bf16
    1.013x; at DeepSeek-V3@tp8 M=1024 (32, busy 43) the mid class's tiles gained nothing; the decode points
    of at most 4 per expert gained nothing from the next class (results/h200-session21). Above 128 no tile
    holds a busy expert, so nothing is added."""
    busy = busy_slots(per_expert)
    holding = next((shapes for height, shapes in _HEIGHTS if busy <= height), ())
    return tuple(dict.fromkeys(_classes(per_expert) + holding))


def split_for(problem: Problem, cfg: TileConfig, sms: int = SMS) -> int:
    """A GEMM1 split-K factor that gives about two programs per SM, or 1 when the grid is full enough.

    GEMM1 runs (experts touched, at most M * topk) x cdiv(I, BLOCK_N) programs; each split
    keeps at least two K steps.
    """
    s = problem.shape
    programs = min(s.experts, problem.M * s.topk) * -(-s.intermediate // cfg.BLOCK_SIZE_N)
    return _split_to_fill(programs, -(-s.hidden // cfg.BLOCK_SIZE_K), sms)


def gemm2_split_for(problem: Problem, cfg: TileConfig, sms: int = SMS) -> int:
    """A GEMM2 split-K factor (``gemm2_split_k``) that gives about two programs per SM, or 1 when GEMM2's
    grid is full enough, as ``split_for`` does for GEMM1: GEMM2 runs (row tiles: at least the experts
    touched) x cdiv(hidden, its BLOCK_N) programs, each over cdiv(I, BLOCK_K) steps; each split keeps at
    least two. At decode with few experts touched (Mixtral M=1: 2 x 64 programs of 56 steps) one program
    per SM streams its expert's rows alone."""
    s = problem.shape
    slots = problem.M * s.topk
    row_tiles = max(min(s.experts, slots), -(-slots // cfg.BLOCK_SIZE_M))
    programs = row_tiles * -(-s.hidden // cfg.block_n2)
    return _split_to_fill(programs, -(-s.intermediate // cfg.BLOCK_SIZE_K), sms)


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
        # Per-step scaling keeps two more tiles live in GEMM1: on an H200 (moebench isa) a
        # 64x128 tile at 4 warps spilled 82 registers (126 with Swap-AB), so give it 8.
        cfg = replace(cfg, num_warps=8)
    return cfg


def candidates(problem: Problem, swap_ab: tuple[bool, ...] = (False, True)) -> list[TileConfig]:
    """Distinct configs to try for ``problem``: the class's shapes (and a busy expert's class's) x Swap-AB x
    the top-k sum's forms (x a split-K variant where GEMM1's grid is small, and one of GEMM2 with the atomic
    sums where its grid is, x 8 row tiles per group where experts often take two row tiles, x a tile per slot
    with no align step where slots are few against experts, x a wider GEMM2 tile at prefill, x GEMM2 programs
    walking 8 column tiles, or 4 at decode, where GEMM2 has at most two K steps (4 at prefill with up to 8),
    x GEMM1 as one merged MMA per K step for 8-warp tiles, x GEMM1 quantizing x itself with a tile per slot
    at fp8-block128, x GEMM1 reading its weights by TMA at fp8 with the align step, x GEMM2 taking its column
    chunks one after another where the atomic sum is larger than L2, x GEMM2 reading weights before it waits
    with a tile per slot at fp8, x half-height tail tiles at 128-row tiles of bf16, and of fp8 where one holds
    a busy expert), fitted to shared memory."""
    s, spec = problem.shape, problem.spec
    per_expert = problem.M * s.topk / s.experts
    # A tile per slot reads an expert's weights once per slot routed to it, so only where few slots share
    # an expert: with uniform routing about T / 2E of the T slots do, at most 1 in 8 here. On an H200 it
    # was 0-16% faster at T <= E / 4 and 31-38% slower at T = E (results/h200-session4).
    direct = (False, True) if 4 * problem.M * s.topk <= s.experts else (False,)
    out: dict[tuple, TileConfig] = {}
    for base in _shapes(per_expert):
        cfg = fit_stages(_for_dtype(base, spec), spec.weight_bytes)
        splits = sorted({1, split_for(problem, cfg)})
        split2 = gemm2_split_for(problem, cfg)
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
            chunked = (*tma, c) if _tries_columns_first(c, problem) else ()
            for form in tma + tuple(replace(g1, gemm2_columns_first=True) for g1 in chunked):
                out.setdefault(form.key(), form)
            if route and spec.fp8_scheme == "block128":
                # On an H200 it won where a program walks few K steps (split-K at M=1) and lost where it
                # walks 14-16 (results/h200-session9/ab-fusions.jsonl), so the tuner measures both; with GEMM2
                # split too, Qwen3 M=1 took 0.927x the time of its best config (results/h200-session11).
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
    With uniform routing the align pads 8-48% more rows at the points of M >= 1024, at their best tiles; a
    balanced routing with none padded made those points 1.09-1.19x faster on an H200 (results/h200-session16,
    padding-bound.jsonl). But a tail tile still reads its whole weight tile: at each point's best config
    (ab-tail-*.jsonl there) half tails took 0.956x the time at Mixtral bf16 M=1024 and 0.986-0.995x at the
    bf16 points of M=4096 (tiles of 128 rows), 1.02x at 64-row bf16 tiles and 1.00-1.08x at fp8; quarter
    tails (``tail_tiles`` = 2) 0.99-1.09x. Tuned (results/h200-kernels-890f8be), the best config of Qwen3
    bf16 M=4096 has them (1.054x faster than without) and Mixtral bf16's best do not.

    Where a 128-row tile holds a busy expert's slots (``_shapes``: 64 per expert) about half the experts' one
    tile holds at most 64 slots, so a tail is no longer only an expert's last tile of several. There, tuned on
    an H200 (results/h200-session21), half tails made the 128x128 tile 1.031x faster at Mixtral bf16 M=256,
    1.027x at Qwen3 bf16 M=1024 and 1.025x at Mixtral fp8-tensor M=256 (each point's fastest config then);
    at Qwen3 fp8-block128 M=1024 the 128-row tiles with them stayed 1.09x slower than 64-row ones, so tails
    are tried at fp8 only there, and not at fp8-block128."""
    if cfg.BLOCK_SIZE_M != 128 or cfg.direct_route:
        return False
    return not spec.is_fp8 or (spec.fp8_scheme != "block128" and busy_slots(per_expert) <= 128)


def _tries_preload(cfg: TileConfig, spec: DtypeSpec) -> bool:
    """Whether to try GEMM2 reading its first two K steps' weights before it waits for GEMM1
    (``gemm2_preload``; a tile per slot, one column tile per program). On an H200 at each tile-per-slot
    point's best config (results/h200-session15/ab-preload.jsonl) it took 0.91x the time at DeepSeek-V3@tp8
    fp8-block128 M=1 (22.0 to 20.1 us) and 0.99-1.0x at Qwen3 fp8-block128 M = 1 and 4; at bf16 (Qwen3 M = 1
    and 4) 1.05-1.09x, where the two tiles held in registers are twice the bytes; at Mixtral M=1 even."""
    return spec.is_fp8 and cfg.direct_route and cfg.gemm2_n_tiles == 1


def _sum_forms(spec: DtypeSpec) -> tuple[tuple[bool, bool], ...]:
    """(atomic_sum, atomic_out) of the top-k sum's forms to try: atomics into a float32 buffer, atomics into
    the output itself, stored rows. On an H200 at each point's best config (results/h200-session11), adding
    into the bf16 output took 0.92-0.99x the time at 12 of the 35 points (DeepSeek-V3@tp8 fp8-block128
    M=4096 0.92x: no float32 buffer to zero, reduce in L2 and cast), 0.99-1.0x at 15 and up to 1.015x at 8;
    with top-8 in bf16 its error against the float32 reference grew from 0.29% to 0.43% (bf16 additions, in
    no fixed order). The best config of each of the 18 points tuned with it uses it
    (results/h200-kernels-d02c38f, -31c76a7). The interpreter has no bf16 atomics, so there it is not
    tried for bf16 activations."""
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
    """Whether to try GEMM1 as one MMA per K step over gate and up rows together (``gemm1_merged``). On an
    H200 at each point's best config (results/h200-session6) it cut the layer's time by 3.6-6.3% at the four
    points whose best tile was 128x128 at 8 warps without Swap-AB (Mixtral bf16 M=1024 and 4096, Mixtral
    fp8-tensor and Qwen3 bf16 M=4096); it was even with Swap-AB, even at fp8-block128 and 0.4-2.3% slower
    with 4-warp tiles."""
    return cfg.num_warps == 8 and not cfg.swap_ab and spec.fp8_scheme != "block128"


def _tries_columns_first(cfg: TileConfig, problem: Problem) -> bool:
    """Whether to try GEMM2 running every row tile of a column chunk before the next
    (``gemm2_columns_first``), so the rows its atomics add into are those of one chunk at a time. Where the
    sum [M, hidden] is larger than L2 and GEMM2 walks the row tiles first, the atomics of each token's top-k
    slots come far apart and its row leaves L2 in between. On an H200 at each point's best config
    (results/h200-session12/ab-columns-first.jsonl), with the sum into the bf16 output it took 0.959x the
    time at DeepSeek-V3@tp8 fp8-block128 M=4096 (a 59 MB sum) and 0.988-1.055x at the other prefill points,
    whose sums fit in L2 (Mixtral M=4096, 34 MB: 1.02x)."""
    sum_bytes = problem.M * problem.shape.hidden * (problem.spec.act.itemsize if cfg.atomic_out else 4)
    return cfg.atomic_sum and cfg.gemm2_split_k == 1 and sum_bytes > L2_BYTES


def _tries_tma(cfg: TileConfig, spec: DtypeSpec, per_expert: float, hidden: int) -> bool:
    """Whether to try GEMM1 reading its weight tiles by TMA (``gemm1_tma``). On an H200, each point at its best
    config (results/h200-session10/gemm1-tma.jsonl), it made the fp8 layers with 16 or more slots per expert
    up to 3.3% faster (Mixtral fp8-tensor M=4096; the fp8-block128 points of M >= 256 by 0.2-2.2%) and 3.6%
    slower at Mixtral fp8-tensor M=1024; bf16 at M >= 1024 even or 3.8-4.1% slower; decode within 1.2%. Only
    without Swap-AB, which these points mostly lose, so the tuner's candidates grow by half, not double. Tuned
    (results/h200-kernels-93e00f1) it won Qwen3 and DeepSeek-V3@tp8 fp8-block128 M=1024 by 1.02x over the best
    config without it and lost Mixtral fp8-tensor M=4096 (its 3.3% above was with Swap-AB). TMA needs rows
    of a multiple of 16 bytes."""
    return (spec.is_fp8 and per_expert >= DECODE_MAX and not cfg.swap_ab and not cfg.gemm1_merged
            and not cfg.direct_route and tma_rows(hidden, spec.weight_bytes))


def _gemm2_widths(cfg: TileConfig, spec: DtypeSpec, per_expert: float) -> tuple[int, ...]:
    """GEMM2 tile widths to try besides GEMM1's (0). At the fp8-block128 prefill points whose best tile was
    64x64, GEMM2 alone at 128 columns made the layer 1-7% faster on an H200 (results/h200-session3-ab,
    gemm2-rows.jsonl), at 8 warps 4-21% slower. At the bf16 and fp8-tensor prefill points whose best tile
    was 128x128 at 8 warps, GEMM2 at 256 columns (its activation tile read from L2 half as often) made
    Mixtral 1.02-1.035x faster at M = 1024 and 4096, Qwen3 bf16 even at M=1024 and 1.05x slower at M=4096
    (results/h200-session9/gemm2-wide.jsonl)."""
    if spec.fp8_scheme == "block128" and per_expert > SMALL_MAX and cfg.BLOCK_SIZE_N == 64:
        return (0, 128)
    if spec.fp8_scheme != "block128" and per_expert > MID_MAX and cfg.BLOCK_SIZE_N == 128 and cfg.num_warps == 8:
        return (0, 256)
    return (0,)


def _gemm2_walks(cfg: TileConfig, intermediate: int, per_expert: float) -> tuple[int, ...]:
    """GEMM2 column tiles per program to try. With K (the intermediate size) at most two K steps, a program
    of one tile ends before its loads could run ahead; walking 8 tiles in one loop made DeepSeek-V3@tp8
    (I = 256) 3-11% faster at M = 64-4096 (2-128 slots per expert) on an H200, and Qwen3 (I = 768,
    6 steps) gained at most 2.5% and lost 5% at M = 64 with 4 (results/h200-session5). At decode 4 tiles
    keep more programs than SMs: tuned, they won DeepSeek-V3@tp8 M=4 and 16 by 1.6-2.3% and lost M=1
    (results/h200-kernels-decode-walk)."""
    k_steps = -(-intermediate // cfg.BLOCK_SIZE_K)
    if k_steps > 2:
        # At Qwen3 fp8-block128 (6 steps) M = 1024 and 4096 (64 and 256 slots per expert), 4 tiles took
        # 0.982x and 0.960x the time at the best config; at M <= 256 1.006-1.044x (results/h200-session11).
        return (1, 4) if k_steps <= 8 and per_expert >= 64 else (1,)
    return (1, 8) if per_expert >= 2 else (1, 4)
