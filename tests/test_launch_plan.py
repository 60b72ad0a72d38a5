"""The rules of ``launch_plan``: every flag and size of the layer's launches from (config, scheme, shapes,
device). A pure function, so these tests launch nothing; each rule is tested where it flips."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from moebench.errors import UserError
from moebench.kernels import fused_moe as fm
from moebench.kernels.align import max_padded_len
from moebench.kernels.fused_moe import DeviceFacts, LayerShapes, launch_plan
from moebench.kernels.tiles import QUANT_BLOCK, QUANT_NONE, QUANT_ROWCOL
from moebench.tile import TileConfig

# A small decode layer: T = 8 slots, I = 256, float32 sums of 4 * 512 * 4 = 8 KiB (GEMM1 zeroes them).
SHAPES = LayerShapes(M=4, experts=8, hidden=512, intermediate=256, topk=2)
GPU = DeviceFacts(pdl=True, interpreting=False)  # an sm90 GPU
CPU = DeviceFacts(pdl=False, interpreting=True)  # the Triton interpreter


def plan(config: TileConfig, scheme: str | None = None, device: DeviceFacts = GPU, **shape):
    return launch_plan(config, scheme, replace(SHAPES, **shape), device)


TILE = TileConfig(16, 64, 128)  # 64-wide GEMM1 tiles, 128-wide K steps (fp8-block128 can run it)
DIRECT = replace(TILE, direct_route=True)

# (config, scheme, shape changes, device, expected fields)
CASES = [
    (TILE, None, {}, GPU,  # 16-bit layer: no fp8 anywhere, h in x's dtype, float32 sums zeroed by GEMM1
     dict(quant=QUANT_NONE, per_tensor=False, quantize_x=False, quantize_h=False, h_fp8=False, sums="float32",
          zero="gemm1", cast_out=True, topk_sum=False, amax_out=False, align=True, pdl=False)),
    (TILE, "channel", {}, GPU,  # per-token scales: a launch quantizes x and one quantizes h, no tile maxima
     dict(quant=QUANT_ROWCOL, per_tensor=False, quantize_x=True, quantize_h=True, h_fp8=False, amax_out=False)),
    (TILE, "tensor", {}, GPU,  # dynamic per-tensor scale of h: GEMM1's programs write their tiles' maxima
     dict(quant=QUANT_ROWCOL, per_tensor=True, quantize_x=True, quantize_h=True, amax_out=True, static_out=False)),
    (replace(TILE, split_k=2), "tensor", {}, GPU,  # split-K: _swiglu writes h, its quantization finds the maximum
     dict(amax_out=False, swiglu=True, quantize_h=True, grid1=8 * 4 * 2)),
    (TILE, "tensor", dict(static_scales=True), GPU,  # static scales: GEMM1's epilogue writes h in fp8
     dict(static=True, static_out=True, h_fp8=True, quantize_h=False, amax_out=False, quantize_x=True)),
    (replace(TILE, split_k=2), "tensor", dict(static_scales=True), GPU,  # static, split-K: a launch quantizes h
     dict(static_out=False, h_fp8=False, quantize_h=True, amax_out=False)),
    (TILE, "block128", {}, GPU,  # fp8-block128, 64-wide tiles: a launch quantizes h's 1x128 groups
     dict(quant=QUANT_BLOCK, group_out=False, quant_out=False, h_fp8=False, quantize_h=True)),
    (replace(TILE, BLOCK_SIZE_N=128), "block128", {}, GPU,  # 128-wide tiles: GEMM1's epilogue writes h in fp8
     dict(group_out=True, quant_out=True, h_fp8=True, quantize_h=False, swiglu=False)),
    (replace(TILE, BLOCK_SIZE_N=128, split_k=2), "block128", {}, GPU,  # split-K: _swiglu writes h in fp8
     dict(group_out=False, quant_out=True, h_fp8=True, quantize_h=False, swiglu=True)),
    (replace(DIRECT, gemm1_quant_x=True), "block128", {}, GPU,  # GEMM1 quantizes x: no launch for x
     dict(x_quant=True, quantize_x=False, pdl=True, align=False, max_blocks=8)),
    (DIRECT, None, {}, GPU,  # a tile per slot on sm90: no align, every launch a programmatic dependent
     dict(align=False, pdl=True, max_blocks=8, grid1=8 * 4, grid2=8 * 8)),
    (DIRECT, None, {}, CPU,  # the interpreter: no dependent launches, fp8 casts rounded first
     dict(pdl=False, round_first=True)),
    (TILE, None, {}, GPU,  # the align step: the grids cover its bound on row tiles, 8 + 8 * 15 slots
     dict(pdl=False, align=True, max_blocks=8, grid1=8 * 4, grid2=8 * 8, round_first=False)),
    (replace(TILE, atomic_sum=False), None, {}, GPU,  # stored rows, summed by _topk_sum: no sums to zero
     dict(sums="rows", zero="none", cast_out=False, topk_sum=True, topk_sum_block=512, topk_sum_cols=1)),
    (replace(TILE, atomic_sum=False), None, dict(M=0), GPU,  # no tokens: nothing to sum, no grid rows
     dict(topk_sum=False, max_blocks=0, grid1=0, grid2=0)),
    (replace(TILE, atomic_out=True), None, {}, GPU,  # the atomics add into the output: no float32 buffer, no cast
     dict(sums="out", zero="gemm1", cast_out=False)),
    (replace(TILE, atomic_out=True), None, dict(out_contiguous=False), GPU,  # rows apart: GEMM1 cannot zero it
     dict(sums="out", zero="launch")),
    (replace(TILE, split_k=3), None, dict(M=0), GPU,  # split-K with no slots: no _swiglu launch
     dict(swiglu=False, split=3)),
    (replace(TILE, gemm2_block_n=128, gemm2_n_tiles=2), None, {}, GPU,  # GEMM2's programs walk 2 wider tiles
     dict(block_n2=128, split2=1, grid2=8 * 2, even_n2=True)),
    (replace(TILE, gemm2_n_tiles=3), None, {}, GPU,  # 3 tiles of 64 per program: the last program's past hidden
     dict(block_n2=64, grid2=8 * 3, even_n2=False)),
    (replace(TILE, gemm2_split_k=2), None, {}, GPU,  # GEMM2 split-K: programs per tile
     dict(split2=2, grid2=8 * 8 * 2)),
    (replace(TILE, BLOCK_SIZE_N=16), None, dict(hidden=328, intermediate=200), GPU,  # K and column tails
     dict(even_k1=False, even_n1=False, even_k2=False, even_n2=False, swiglu_block_n=256, swiglu_block_g=2,
          topk_sum_block=512, topk_sum_cols=1)),
    (TILE, None, dict(hidden=4096, intermediate=1100), GPU,  # wide layers: the launches' blocks stop growing
     dict(even_k1=True, even_n1=False, swiglu_block_n=1024, swiglu_block_g=8, topk_sum_block=1024,
          topk_sum_cols=4, grid1=8 * 18)),
    (TILE, "channel", dict(act_per_tensor=True), GPU,  # channel weights, one activation scale per tensor
     dict(quant=QUANT_ROWCOL, per_tensor=True, act_scheme="tensor", amax_out=True)),
    (TILE, "channel", dict(act_per_tensor=True, static_scales=True), GPU,  # the same, static: h in fp8 by GEMM1
     dict(per_tensor=True, static_out=True, quantize_h=False)),
    (replace(TILE, BLOCK_SIZE_K=64), "block128", dict(block_shape=(64, 64)), GPU,  # 64x64 blocks: a 64-wide tile
     dict(scale_n=64, scale_k=64, act_scheme="block128", group_out=True, h_fp8=True, swiglu_block_g=4)),
    (DIRECT, None, dict(remote_slots=True), GPU,  # expert_map: the ids GEMM1 reads before a wait are a launch's
     dict(align=False, pdl=False)),
    (replace(TILE, atomic_sum=False), None, dict(remote_slots=True), GPU,  # expert_map: rows no tile writes, zero
     dict(sums="rows", zero_rows=True)),
    (replace(TILE, split_k=2), "tensor", dict(remote_slots=True), GPU,  # h's per-tensor maximum reads every row
     dict(zero_partials=True, amax_out=False)),
    (replace(TILE, split_k=2), "channel", dict(remote_slots=True), GPU,  # per-row scales: unwritten rows unread
     dict(zero_partials=False)),
]


@pytest.mark.parametrize("config, scheme, shape, device, expected", CASES)
def test_launch_plan(config, scheme, shape, device, expected):
    got = plan(config, scheme, device, **shape)
    assert {k: getattr(got, k) for k in expected} == expected


def test_block_scales_need_one_block_per_k_step():
    """A block of block_k columns needs BLOCK_SIZE_K = block_k (one scale block per step): a one-line UserError."""
    with pytest.raises(UserError, match=r"blocks of \[128, 64\] needs BLOCK_SIZE_K=64"):
        plan(TILE, "block128", block_shape=(128, 64))
    assert plan(replace(TILE, BLOCK_SIZE_K=64), "block128", block_shape=(128, 64)).scale_k == 64


def test_grids_cover_the_align_bound_at_any_m():
    """The grids' row tiles are the align's bound from shapes (T + min(T, E) * (BLOCK_M - 1), in tiles), or
    T with a tile per slot: no host read of the used length."""
    for M in (1, 3, 64, 1000):
        T = 2 * M
        assert plan(TILE, M=M).max_blocks == max_padded_len(T, 8, 16) // 16
        assert plan(DIRECT, M=M).max_blocks == T
        assert plan(TILE, M=M).grid1 == max_padded_len(T, 8, 16) // 16 * 4


@pytest.mark.parametrize("atomic_out, elem", [(False, 4), (True, 2)])
def test_gemm1_zeroes_the_sums_up_to_its_byte_limit(atomic_out, elem):
    """GEMM1 zeroes sums of at most ZERO_IN_GEMM1_BYTES (float32, or the bf16 output with atomic_out); one
    token more and a launch does, or at fp8-block128 x's quantization launch, unless GEMM1 quantizes x."""
    config = replace(TILE, atomic_out=atomic_out)
    at_limit = fm.ZERO_IN_GEMM1_BYTES // (SHAPES.hidden * elem)
    assert plan(config, M=at_limit).zero == "gemm1"
    assert plan(config, M=at_limit + 1).zero == "launch"
    assert plan(config, "block128", M=at_limit + 1).zero == "x_quant"
    assert plan(replace(config, direct_route=True, gemm1_quant_x=True), "block128", M=at_limit + 1).zero == "launch"
    assert plan(config, "block128", M=at_limit).zero == "gemm1"


def test_block128_needs_128_wide_k_steps():
    with pytest.raises(UserError, match="BLOCK_SIZE_K=128"):
        plan(replace(TILE, BLOCK_SIZE_K=64), "block128")
    assert plan(replace(TILE, BLOCK_SIZE_K=64), "channel").quant == QUANT_ROWCOL


@pytest.mark.parametrize("scheme", [None, "tensor", "channel"])
def test_x_quantized_by_gemm1_is_for_block128(scheme):
    with pytest.raises(UserError, match="gemm1_quant_x is for fp8-block128"):
        plan(replace(DIRECT, gemm1_quant_x=True), scheme)


def test_gemm1_tma_needs_rows_of_16_bytes():
    """TMA reads rows whose bytes are a multiple of 16: 520 fp8 bytes are not, 520 bf16 bytes are."""
    config = replace(TILE, gemm1_tma=True)
    with pytest.raises(UserError, match="gemm1_tma"):
        plan(config, "tensor", hidden=520, weight_bytes=1)
    assert plan(config, None, hidden=520, weight_bytes=2).even_k1 is False


def test_static_scales_are_per_tensor():
    """Static activation scales come with fp8-tensor weights only: anything else is a caller's bug."""
    with pytest.raises(AssertionError, match="per tensor"):
        plan(TILE, "channel", static_scales=True)


def test_no_bf16_atomics_under_the_interpreter():
    config = replace(TILE, atomic_out=True)
    with pytest.raises(AssertionError, match="bf16 atomics"):
        plan(config, None, CPU, out_dtype=torch.bfloat16)
    assert plan(config, None, CPU, out_dtype=torch.float16).sums == "out"
    assert plan(config, None, GPU, out_dtype=torch.bfloat16).sums == "out"


def test_layer_shapes_of_tensors():
    """The shapes the launcher passes: from x [M, hidden], w13 [E, 2I, hidden], topk_ids [M, topk] and out."""
    x = torch.empty(5, 96, dtype=torch.float16)
    w13 = torch.empty(6, 2 * 48, 96, dtype=torch.float8_e4m3fn)
    ids = torch.empty(5, 2, dtype=torch.int32)
    assert LayerShapes.of(x, w13, ids) == LayerShapes(5, 6, 96, 48, 2, False, torch.float16, True, 1)
    out = torch.empty(5, 128, dtype=torch.float32)[:, :96]
    shapes = LayerShapes.of(x, w13, ids, out, act_scale=torch.ones(2))
    assert (shapes.out_dtype, shapes.out_contiguous, shapes.static_scales, shapes.slots) == (
        torch.float32, False, True, 10)
