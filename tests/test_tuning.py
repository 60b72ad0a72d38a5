"""The tile-config search space."""

from __future__ import annotations

from dataclasses import replace

import pytest

from moebench.hardware import HOPPER, DeviceLimits
from moebench.models import get_model, shard
from moebench.problem import Problem
from moebench.tile import default_config, smem_bytes
from moebench.tune.handpicked import candidates

POINTS = [
    (get_model("mixtral-8x7b"), 1, "bf16"),  # decode: 16-row tiles
    (get_model("mixtral-8x7b"), 4096, "fp8-tensor"),  # prefill: tall tiles, fp8 doubles BLOCK_K
    (get_model("qwen3-30b-a3b"), 64, "fp8-block128"),  # block scales pin BLOCK_K to 128
    (shard(get_model("deepseek-v3"), tp=8), 1024, "fp8-block128"),
]


@pytest.mark.parametrize("shape, M, dtype", POINTS)
def test_candidates_are_distinct_fit_and_come_with_and_without_swap(shape, M, dtype):
    problem = Problem(shape, M, dtype)
    cands = candidates(problem)
    assert len({c.key() for c in cands}) == len(cands) >= 4
    assert {c.swap_ab for c in cands} == {False, True}
    for c in cands:
        assert smem_bytes(c, problem.spec.weight_bytes) <= HOPPER.smem_bytes or c.num_stages == 1
        if dtype == "fp8-block128":
            assert c.BLOCK_SIZE_K == 128


def test_tile_height_grows_with_tokens_per_expert():
    shape = get_model("mixtral-8x7b")
    small = max(c.BLOCK_SIZE_M for c in candidates(Problem(shape, 1, "bf16")))
    large = max(c.BLOCK_SIZE_M for c in candidates(Problem(shape, 4096, "bf16")))
    assert small == 16 and large >= 128


def test_the_lowest_tiles_holding_a_busy_expert_are_tried_beside_the_average_ones():
    """At 16 slots per expert (the decode class's most) uniform routing gives about 43% of the experts more
    than 16 slots: the small class's 32-row tiles are tried beside the 16-row ones; at 64 the prefill class's
    128-row tiles beside the mid class's. At 4 per expert a busy expert still fits 16 rows, and at 256 no tile
    holds one: only the average's class."""
    shape = get_model("mixtral-8x7b")

    def heights(m: int) -> set[int]:
        return {c.BLOCK_SIZE_M for c in candidates(Problem(shape, m, "bf16"))}

    assert heights(16) == {16}
    assert heights(64) == {16, 32, 64}
    at64 = {(c.BLOCK_SIZE_M, c.BLOCK_SIZE_N, c.num_warps) for c in candidates(Problem(shape, 256, "bf16"))}
    assert {(128, 128, 8), (64, 64, 4)} <= at64
    assert heights(1024) == {64, 128}  # the prefill class's alone


def test_default_tile_holds_a_busy_expert_up_to_64_rows():
    """The untuned tile: 16 rows where a busy expert fits (8 slots per expert on average), 32 at 16 per
    expert (a busy one gets about 24), 64 at 32 per expert; taller follows the average (128 above 96)."""
    heights = {per_expert: default_config(per_expert * 8, 8, 1).BLOCK_SIZE_M for per_expert in (8, 16, 32, 64, 128)}
    assert heights == {8: 16, 16: 32, 32: 64, 64: 64, 128: 128}


def test_every_class_tries_the_three_forms_of_the_topk_sum(monkeypatch):
    """Prefill and decode candidates include the atomic epilogue into float32 and into the output, and the
    stored-rows top-k sum; under the interpreter (no bf16 atomics) not the output form for bf16 outputs."""
    import moebench.tune.handpicked as tuning

    shape = get_model("qwen3-30b-a3b")
    forms = {(True, False), (True, True), (False, False)}
    monkeypatch.setattr(tuning, "interpreting", lambda: False)
    for m, dtype in ((4096, "bf16"), (1, "bf16"), (64, "fp8-block128")):
        assert {(c.atomic_sum, c.atomic_out) for c in candidates(Problem(shape, m, dtype))} == forms
    monkeypatch.setattr(tuning, "interpreting", lambda: True)
    assert {(c.atomic_sum, c.atomic_out) for c in candidates(Problem(shape, 64, "fp8-block128"))} == forms - {
        (True, True)}
    assert {(c.atomic_sum, c.atomic_out) for c in candidates(Problem(shape, 64, "fp16"))} == forms


def test_block128_tall_tiles_get_eight_warps():
    """Per-step block scaling spills at 4 warps on tall tiles: those get 8; every K step is one scale block."""
    cands = candidates(Problem(get_model("qwen3-30b-a3b"), 4096, "fp8-block128"))
    big = [c for c in cands if c.BLOCK_SIZE_M * c.BLOCK_SIZE_N >= 64 * 128]
    assert big and all(c.num_warps == 8 for c in big)
    assert all(c.BLOCK_SIZE_K == 128 for c in cands)


def test_split_k_only_where_gemm1_grid_is_small():
    """DeepSeek-V3@tp8 at M=1 (8 experts x few column tiles) gets split-K variants; prefill does not."""
    from moebench.tune.handpicked import split_for

    ds = shard(get_model("deepseek-v3"), tp=8)
    decode = candidates(Problem(ds, 1, "fp8-block128"))
    assert max(c.split_k for c in decode) > 1
    for c in decode:  # every split keeps at least two K steps
        assert -(-ds.hidden // c.BLOCK_SIZE_K) // c.split_k >= 2
    assert {c.split_k for c in candidates(Problem(get_model("mixtral-8x7b"), 4096, "bf16"))} == {1}
    cfg = decode[0]  # 8 experts x cdiv(256, BLOCK_N) programs: split until about two per SM
    programs = min(ds.experts, ds.topk) * -(-ds.intermediate // cfg.BLOCK_SIZE_N)
    split = split_for(Problem(ds, 1, "fp8-block128"), cfg)
    assert programs * split >= 2 * 132 and programs * split // 2 < 2 * 132


def test_direct_route_only_where_slots_are_few_against_experts():
    """A tile per slot (no align step) is tried where 4 * M * topk <= E, beside the aligned tiles; not
    where many slots would share an expert and read its weights once each."""
    ds = shard(get_model("deepseek-v3"), tp=8)
    decode = candidates(Problem(ds, 1, "fp8-block128"))
    assert {c.direct_route for c in decode} == {False, True}
    assert {c.direct_route for c in candidates(Problem(get_model("qwen3-30b-a3b"), 4, "bf16"))} == {False, True}
    assert not any(c.direct_route for c in candidates(Problem(get_model("qwen3-30b-a3b"), 16, "bf16")))
    assert not any(c.direct_route for c in candidates(Problem(get_model("mixtral-8x7b"), 4, "bf16")))
    assert not any(c.direct_route for c in candidates(Problem(ds, 4096, "fp8-block128")))


def test_wider_gemm2_tile_tried_at_prefill_only():
    """fp8-block128 prefill tiles 64 wide also come with GEMM2 at 128 columns, and bf16 / fp8-tensor prefill
    tiles 128 wide at 8 warps with GEMM2 at 256; no other tile, and nothing at decode."""
    ds = shard(get_model("deepseek-v3"), tp=8)
    prefill = candidates(Problem(ds, 4096, "fp8-block128"))
    assert {c.block_n2 for c in prefill if c.BLOCK_SIZE_N == 64} == {64, 128}
    assert all(c.block_n2 == c.BLOCK_SIZE_N for c in prefill if c.BLOCK_SIZE_N != 64)
    for dtype in ("bf16", "fp8-tensor"):
        wide = [c for c in candidates(Problem(get_model("qwen3-30b-a3b"), 4096, dtype)) if c.block_n2 != c.BLOCK_SIZE_N]
        assert wide and all(c.block_n2 == 256 and c.BLOCK_SIZE_N == 128 and c.num_warps == 8 for c in wide)
    for problem in (Problem(ds, 1, "fp8-block128"), Problem(get_model("mixtral-8x7b"), 16, "bf16")):
        assert all(c.block_n2 == c.BLOCK_SIZE_N for c in candidates(problem))


def test_gemm2_walks_column_tiles_only_where_its_k_loop_is_short():
    """DeepSeek-V3@tp8 (I = 256: two K steps of 128) gets GEMM2 programs walking 8 column tiles beside
    single tiles from 2 slots per expert (M = 64) on, and 4 at decode; Qwen3 at fp8-block128 (I = 768: six
    steps) gets 4 from 64 slots per expert (M = 1024) on; Qwen3 in bf16 (12 steps of 64) and Mixtral do not."""
    ds = shard(get_model("deepseek-v3"), tp=8)
    for m in (64, 4096):
        assert {c.gemm2_n_tiles for c in candidates(Problem(ds, m, "fp8-block128"))} == {1, 8}
    for m in (1, 16):
        assert {c.gemm2_n_tiles for c in candidates(Problem(ds, m, "fp8-block128"))} == {1, 4}
    qwen = get_model("qwen3-30b-a3b")
    for m in (1024, 4096):
        assert {c.gemm2_n_tiles for c in candidates(Problem(qwen, m, "fp8-block128"))} == {1, 4}
    assert {c.gemm2_n_tiles for c in candidates(Problem(qwen, 256, "fp8-block128"))} == {1}
    assert {c.gemm2_n_tiles for c in candidates(Problem(qwen, 4096, "bf16"))} == {1}
    assert {c.gemm2_n_tiles for c in candidates(Problem(get_model("mixtral-8x7b"), 64, "bf16"))} == {1}


def test_gemm2_split_k_tried_with_the_atomic_sum_where_gemm2_grid_is_small():
    """Mixtral M=1 (2 experts x 32-64 column tiles) and Qwen3 M=1 (8 x 16-64) get GEMM2 split-K variants,
    only with the atomic top-k sum and one column tile per program; prefill and DeepSeek-V3@tp8 (two K
    steps) none."""
    for shape, m in ((get_model("mixtral-8x7b"), 1), (get_model("qwen3-30b-a3b"), 1)):
        cands = candidates(Problem(shape, m, "bf16"))
        split = [c for c in cands if c.gemm2_split_k > 1]
        assert split and all(c.atomic_sum and c.gemm2_n_tiles == 1 for c in split)
    qwen_fp8 = candidates(Problem(get_model("qwen3-30b-a3b"), 1, "fp8-block128"))
    assert any(c.gemm2_split_k > 1 and c.gemm1_quant_x for c in qwen_fp8)  # with GEMM1 quantizing x too
    for shape, m in ((get_model("mixtral-8x7b"), 4096), (shard(get_model("deepseek-v3"), tp=8), 1)):
        assert {c.gemm2_split_k for c in candidates(Problem(shape, m, "fp8-block128"))} == {1}


def test_merged_gemm1_tried_with_8_warp_tiles_without_swap_and_not_at_block128():
    """GEMM1 as one merged MMA is tried beside the pair of MMAs for 8-warp tiles without Swap-AB (where it
    pays), never with 4 warps, Swap-AB or fp8-block128."""
    for dtype in ("bf16", "fp8-tensor"):
        tried = [c for c in candidates(Problem(get_model("mixtral-8x7b"), 4096, dtype)) if c.gemm1_merged]
        assert tried and all(c.num_warps == 8 and not c.swap_ab for c in tried)
        assert {replace(c, gemm1_merged=False).key() for c in tried} <= {
            c.key() for c in candidates(Problem(get_model("mixtral-8x7b"), 4096, dtype))}
    ds = shard(get_model("deepseek-v3"), tp=8)
    assert not any(c.gemm1_merged for c in candidates(Problem(ds, 4096, "fp8-block128")))
    assert not any(c.gemm1_merged for c in candidates(Problem(get_model("qwen3-30b-a3b"), 1, "bf16")))


def test_x_quantized_by_gemm1_tried_with_a_tile_per_slot_at_block128_only():
    """GEMM1 quantizing x itself is tried beside the quantization launch for every tile-per-slot candidate
    at fp8-block128 decode, and nowhere else (not at other dtypes, not with the align step)."""
    ds = shard(get_model("deepseek-v3"), tp=8)
    cands = candidates(Problem(ds, 1, "fp8-block128"))
    tried = [c for c in cands if c.gemm1_quant_x]
    assert {replace(c, gemm1_quant_x=False).key() for c in tried} == {
        c.key() for c in cands if c.direct_route and not c.gemm1_quant_x}
    assert not any(c.gemm1_quant_x for c in candidates(Problem(ds, 1024, "fp8-block128")))
    assert not any(c.gemm1_quant_x for c in candidates(Problem(get_model("qwen3-30b-a3b"), 1, "bf16")))


def test_gemm1_weights_by_tma_tried_at_fp8_with_16_or_more_slots_per_expert():
    """Each candidate without Swap-AB of an fp8 point with 16 or more slots per expert has a twin reading
    GEMM1's weights by TMA (not with the merged MMA or a tile per slot); bf16 and decode points have none."""
    for model, m, dtype in ((get_model("qwen3-30b-a3b"), 1024, "fp8-block128"),
                            (get_model("mixtral-8x7b"), 4096, "fp8-tensor")):
        cands = candidates(Problem(model, m, dtype))
        tried = [c for c in cands if c.gemm1_tma]
        assert {replace(c, gemm1_tma=False).key() for c in tried} == {
            c.key() for c in cands if not (c.gemm1_tma or c.swap_ab or c.gemm1_merged or c.direct_route)}
    ds = shard(get_model("deepseek-v3"), tp=8)
    assert not any(c.gemm1_tma for c in candidates(Problem(ds, 4, "fp8-block128")))  # 0.125 slots per expert
    assert not any(c.gemm1_tma for c in candidates(Problem(get_model("mixtral-8x7b"), 4096, "bf16")))
    odd_rows = replace(get_model("qwen3-30b-a3b"), hidden=2056)  # 2056 fp8 bytes: not a multiple of 16
    assert not any(c.gemm1_tma for c in candidates(Problem(odd_rows, 1024, "fp8-block128")))


def test_grouped_row_tiles_tried_where_experts_often_take_two_row_tiles():
    """Where the average slots per expert pass half a tile's height, a class shape of one row tile per
    group is also tried with 8 (an expert's second row tile then reads its weights from L2), never with a
    tile per slot; at decode, with about one slot per expert, it is not."""
    mixtral = get_model("mixtral-8x7b")  # M=64, top-2, E=8: 16 slots per expert on average
    tried = candidates(Problem(mixtral, 64, "bf16"))
    short = {replace(c, GROUP_SIZE_M=1).key() for c in tried if c.GROUP_SIZE_M == 8 and c.BLOCK_SIZE_M == 16}
    assert short and short <= {c.key() for c in tried}  # each beside its one-row-tile-per-group twin
    ds = shard(get_model("deepseek-v3"), tp=8)
    assert not any(c.direct_route and c.GROUP_SIZE_M != 1 for c in candidates(Problem(ds, 4, "fp8-block128")))
    assert {c.GROUP_SIZE_M for c in candidates(Problem(ds, 4, "fp8-block128"))} == {1}
    assert {c.GROUP_SIZE_M for c in candidates(Problem(mixtral, 16, "bf16"))} == {1}  # 4 slots per expert


def test_gemm2_columns_first_tried_where_the_atomic_sum_is_larger_than_l2(monkeypatch):
    """DeepSeek-V3@tp8 M=4096 sums into [4096, 7168] (59 MB in bf16, more than the 50 MB L2): each of its
    atomic-sum candidates, the bf16-output form included (as on a GPU), has a twin taking GEMM2's column
    chunks one after another, and no stored-sum candidate does. Qwen3 M=4096 (17 MB in bf16, 34 MB in
    float32) and decode get none. The L2 is an H100/H200 SXM's 50 MiB (a device may report more)."""
    import moebench.tune.handpicked as tuning

    monkeypatch.setattr(tuning, "interpreting", lambda: False)
    ds = shard(get_model("deepseek-v3"), tp=8)
    cands = candidates(Problem(ds, 4096, "fp8-block128"), limits=HOPPER)
    tried = [c for c in cands if c.gemm2_columns_first]
    assert any(c.atomic_out for c in tried) and all(c.atomic_sum for c in tried)
    assert {replace(c, gemm2_columns_first=False).key() for c in tried} == {
        c.key() for c in cands if c.atomic_sum and not c.gemm2_columns_first}
    for model, m in ((get_model("qwen3-30b-a3b"), 4096), (ds, 1)):
        assert not any(c.gemm2_columns_first for c in candidates(Problem(model, m, "fp8-block128"), limits=HOPPER))


def test_gemm2_preload_tried_with_a_tile_per_slot_at_fp8_only():
    """GEMM2 reading weights before it waits is tried beside every fp8 tile-per-slot candidate of one GEMM2
    column tile per program, and nowhere else (not at bf16, not with the align step)."""
    ds = shard(get_model("deepseek-v3"), tp=8)
    cands = candidates(Problem(ds, 1, "fp8-block128"))
    tried = [c for c in cands if c.gemm2_preload]
    assert tried and {replace(c, gemm2_preload=False).key() for c in tried} == {
        c.key() for c in cands if c.direct_route and c.gemm2_n_tiles == 1 and not c.gemm2_preload}
    assert not any(c.gemm2_preload for c in candidates(Problem(ds, 1024, "fp8-block128")))
    assert not any(c.gemm2_preload for c in candidates(Problem(get_model("qwen3-30b-a3b"), 1, "bf16")))
    assert any(c.gemm2_preload for c in candidates(Problem(get_model("mixtral-8x7b"), 1, "fp8-tensor")))


@pytest.mark.parametrize("model, m, dtype", [
    ("mixtral-8x7b", 256, "bf16"), ("mixtral-8x7b", 1024, "bf16"),  # 64 and 256 slots per expert
    ("mixtral-8x7b", 256, "fp8-tensor"),  # at fp8 where a 128-row tile holds a busy expert
])
def test_tail_tiles_tried_beside_every_candidate_of_128_rows(model, m, dtype):
    """Half-height tail tiles beside each candidate of 128 rows, at no other height."""
    cands = candidates(Problem(get_model(model), m, dtype))
    tried = [c for c in cands if c.tail_tiles]
    assert tried and all(c.tail_tiles == 1 for c in tried)
    assert {replace(c, tail_tiles=0).key() for c in tried} == {
        c.key() for c in cands if c.BLOCK_SIZE_M == 128 and not c.tail_tiles}


def test_tail_tiles_not_tried_at_fp8_prefill_block128_or_decode():
    """Not at fp8 where an expert takes several 128-row tiles, not at fp8-block128, not at 16-row tiles."""
    mixtral, qwen3 = get_model("mixtral-8x7b"), get_model("qwen3-30b-a3b")
    for problem in (Problem(mixtral, 1024, "fp8-tensor"), Problem(qwen3, 1024, "fp8-block128"),
                    Problem(mixtral, 16, "bf16")):
        assert not any(c.tail_tiles for c in candidates(problem))


def test_the_device_limits_shape_the_candidates():
    """SM count, L2 size and shared memory come from the device the candidates are for: fewer SMs split
    GEMM1 less, a larger L2 holds DeepSeek-V3@tp8 M=4096's atomic sum (no columns-first twins), and less
    shared memory lowers the stages. On a GPU-less machine the default is an H100/H200 (``HOPPER``)."""
    ds = shard(get_model("deepseek-v3"), tp=8)
    decode = Problem(ds, 1, "fp8-block128")
    if DeviceLimits.current() == HOPPER:  # no GPU here, or an H100/H200
        assert candidates(decode) == candidates(decode, limits=HOPPER)
    few_sms = DeviceLimits(sms=16, l2_bytes=HOPPER.l2_bytes, smem_bytes=HOPPER.smem_bytes)
    assert max(c.split_k for c in candidates(decode, limits=few_sms)) < max(
        c.split_k for c in candidates(decode, limits=HOPPER))
    prefill = Problem(ds, 4096, "fp8-block128")
    big_l2 = DeviceLimits(sms=HOPPER.sms, l2_bytes=1 << 30, smem_bytes=HOPPER.smem_bytes)
    assert any(c.gemm2_columns_first for c in candidates(prefill, limits=HOPPER))
    assert not any(c.gemm2_columns_first for c in candidates(prefill, limits=big_l2))
    small_smem = DeviceLimits(sms=HOPPER.sms, l2_bytes=HOPPER.l2_bytes, smem_bytes=64 * 1024)
    for c in candidates(prefill, limits=small_smem):
        assert smem_bytes(c, 1) <= 64 * 1024 or c.num_stages == 1
    assert max(c.num_stages for c in candidates(prefill, limits=small_smem)) < max(
        c.num_stages for c in candidates(prefill, limits=HOPPER))
