"""Every path against the float32 reference, on fresh random inputs, output poisoned first.

On the CPU the Triton kernels run under the interpreter in fp16 and fp32 (its
bf16 dot is wrong); on a CUDA GPU the same tests add bf16 and the CUTLASS path.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import garbage_from_empty
from point_checks import check_point

from moebench._interpret import interpreting
from moebench.dtypes import DTYPES
from moebench.errors import UserError
from moebench.kernels.act_quant import quantize_act
from moebench.models import MoEShape
from moebench.paths.base import Target
from moebench.paths.cutlass_path import grouped_moe_bf16
from moebench.paths.registry import get_path
from moebench.paths.torch_ref import moe_reference
from moebench.problem import Problem, make_inputs
from moebench.tile import TileConfig

GPU = torch.cuda.is_available() and not interpreting()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TRITON_DTYPES = ["fp16", "fp32", "fp8-tensor", "fp8-tensor-static", "fp8-channel", "fp8-block128"] + (
    ["bf16"] if GPU else [])

# (experts, hidden, intermediate, topk, M)
CASES = [
    (8, 128, 64, 2, 1),  # M = 1: one token, most experts get nothing
    (8, 128, 64, 1, 7),  # top-k = 1
    (8, 128, 64, 8, 5),  # top-k = E: every expert gets every token
    (6, 96, 48, 2, 33),  # E not a power of two; hidden and I not multiples of the tile
    (16, 160, 80, 4, 3),  # M*topk < E: experts with no tokens
    (4, 64, 32, 2, 40),  # several tiles per expert
]


def _shape(e, h, i, k) -> MoEShape:
    return MoEShape("test", e, h, i, k)


# Every routing case at fp16 and fp8-block128 (per-group scales, the most the tiles index); the other dtypes at the
# cases with hidden and I off the tile (K and column tails) and with several tiles per expert.
ALL_CASES_DTYPES = ["fp16", "fp8-block128"] + (["bf16"] if GPU else [])
MATCH_CASES = [(c, d) for d in TRITON_DTYPES for c in (CASES if d in ALL_CASES_DTYPES else (CASES[3], CASES[5]))]


@pytest.mark.parametrize("swap_ab", [False, True])
@pytest.mark.parametrize("case, dtype", MATCH_CASES)
def test_triton_matches_reference(case, dtype, swap_ab):
    """The triton path, plain and Swap-AB, writes every output element and matches the fp32 reference."""
    e, h, i, k, m = case
    problem = Problem(_shape(e, h, i, k), m, dtype, seed=3)
    inputs = make_inputs(problem, DEVICE, draw=1)
    path = get_path("triton")
    config = replace(path.default_config(problem), swap_ab=swap_ab)
    result = check_point(path, problem, inputs, config)
    assert result.correct, f"rel. error {result.rel_err}"


@pytest.mark.parametrize("swap_ab", [False, True])
@pytest.mark.parametrize("dtype", [d for d in TRITON_DTYPES if d != "fp32"])  # fp16: the unscaled form
def test_merged_gemm1_matches_reference(dtype, swap_ab):
    """GEMM1 as one MMA per K step over gate and up rows side by side (``gemm1_merged``) matches the fp32
    reference in fp16 and every fp8 scale scheme, plain and Swap-AB (hidden and I not multiples of the tile)."""
    problem = Problem(_shape(6, 96, 48, 2), 33, dtype, seed=4)
    path = get_path("triton")
    config = replace(path.default_config(problem), swap_ab=swap_ab, gemm1_merged=True)
    result = check_point(path, problem, make_inputs(problem, DEVICE, draw=1), config)
    assert result.correct, f"rel. error {result.rel_err}"


@pytest.mark.parametrize("swap_ab", [False, True])
@pytest.mark.parametrize("dtype", TRITON_DTYPES)
def test_topk_sum_into_the_output_matches_reference(dtype, swap_ab):
    """GEMM2's atomics adding straight into the output (``atomic_out``, bf16 or fp16 additions) match the
    fp32 reference in every dtype and scale scheme, plain and Swap-AB, top-2 and top-6 of 6 experts."""
    problem = Problem(_shape(6, 96, 48, 2), 33, dtype, seed=4)
    if interpreting() and problem.spec.act == torch.bfloat16:
        pytest.skip("the Triton interpreter has no bf16 atomics")
    path = get_path("triton")
    for topk in (2, 6):
        problem = Problem(_shape(6, 96, 48, topk), 33, dtype, seed=4)
        config = replace(path.default_config(problem), swap_ab=swap_ab, atomic_sum=True, atomic_out=True)
        result = check_point(path, problem, make_inputs(problem, DEVICE, draw=1), config)
        assert result.correct, f"top-{topk}: rel. error {result.rel_err}"


@pytest.mark.parametrize("config", [
    TileConfig(16, 32, 32, 1, 4, 2),  # smallest tiles: many K steps
    TileConfig(32, 64, 16, 4, 4, 2),  # grouped tile order
    TileConfig(64, 16, 64, 2, 4, 2),  # tile taller than any expert's share
    TileConfig(32, 32, 32, 1, 4, 2, swap_ab=True, atomic_sum=False),  # rows stored, then summed over top-k
    TileConfig(16, 16, 16, 1, 4, 2, split_k=4),  # split-K GEMM1: 6 K steps over 4 splits, one split short
    TileConfig(16, 32, 32, 1, 4, 2, swap_ab=True, split_k=8),  # more splits than K steps: empty splits add 0
    TileConfig(32, 32, 32, 1, 4, 2, gemm2_block_n=64),  # GEMM2 wider than GEMM1
    TileConfig(16, 64, 32, 2, 4, 2, swap_ab=True, atomic_sum=False, gemm2_block_n=16),  # and narrower
    TileConfig(16, 32, 32, 1, 4, 2, gemm2_n_tiles=3),  # one GEMM2 program walks all 3 column tiles
    TileConfig(32, 32, 16, 2, 4, 2, swap_ab=True, atomic_sum=False, gemm2_n_tiles=2),  # 2nd walk half past N
    TileConfig(16, 32, 32, 1, 4, 2, gemm1_merged=True),  # one GEMM1 MMA over gate and up rows; I = 48: 2nd tile half
    TileConfig(32, 64, 32, 1, 4, 2, swap_ab=True, gemm1_merged=True, split_k=2),  # swapped, partial sums
    TileConfig(16, 32, 16, 1, 4, 2, gemm2_split_k=2),  # GEMM2's 3 K steps over 2 programs: 2 and 1
    TileConfig(16, 32, 16, 1, 4, 2, swap_ab=True, gemm2_split_k=4),  # 4 splits of 1 step, the last empty
    TileConfig(16, 32, 16, 1, 4, 2, split_k=2, gemm2_split_k=2, atomic_out=True),  # both GEMMs split
    TileConfig(16, 32, 32, 4, 4, 2, gemm2_columns_first=True),  # GEMM2's row tiles of a column tile first
    TileConfig(32, 16, 32, 2, 4, 2, swap_ab=True, gemm2_n_tiles=2, gemm2_columns_first=True),  # chunks of 2 tiles
    TileConfig(16, 32, 32, 1, 4, 2, atomic_sum=False, gemm2_columns_first=True),  # stored rows
])
def test_triton_any_tile_config_is_correct(config):
    """Correctness does not depend on the tile config (padding, grouping, K tail)."""
    from moebench.kernels.fused_moe import fused_moe

    problem = Problem(_shape(6, 96, 48, 2), 21, "fp32", seed=5)
    inp = make_inputs(problem, DEVICE, draw=1)
    w = inp.weights
    out = torch.full((21, 96), float("nan"), device=DEVICE)
    fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, config, out=out)
    ref = moe_reference(inp.x, w, inp.topk_weights, inp.topk_ids)
    assert torch.isfinite(out).all()
    assert torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref) < DTYPES["fp32"].rtol


def test_grouped_gemm_logic_matches_reference():
    """The CUTLASS path's sort / grouped GEMM / combine logic (run by torch._grouped_mm on this device)."""
    problem = Problem(_shape(8, 128, 64, 2), 19, "bf16", seed=7)
    inp = make_inputs(problem, DEVICE, draw=1)
    out = torch.full((19, 128), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    grouped_moe_bf16(inp.x, inp.weights.w13, inp.weights.w2, inp.topk_weights, inp.topk_ids, out)
    ref = moe_reference(inp.x, inp.weights, inp.topk_weights, inp.topk_ids)
    assert torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref) < 2e-2


def test_cutlass_refuses_without_sm90():
    """On anything but an sm90 GPU the cutlass path says why it cannot run."""
    cpu = Target(torch.device("cpu"), True, None)
    reason = get_path("cutlass").supports(Problem(_shape(8, 128, 64, 2), 4, "bf16"), cpu)
    assert reason and "sm90" in reason


def test_triton_refuses_bf16_under_interpreter():
    """bf16 under the interpreter would compute wrong dots: the path refuses instead of reporting garbage."""
    cpu = Target(torch.device("cpu"), True, None)
    assert get_path("triton").supports(Problem(_shape(8, 128, 64, 2), 4, "bf16"), cpu)
    assert get_path("triton").supports(Problem(_shape(8, 128, 64, 2), 4, "fp16"), cpu) is None


@pytest.mark.skipif(not GPU, reason="needs an sm90 GPU")
@pytest.mark.parametrize("dtype", ["bf16", "fp8-tensor", "fp8-tensor-static", "fp8-channel"])
@pytest.mark.parametrize("case", CASES[:5])
def test_cutlass_matches_reference(case, dtype):
    e, h, i, k, m = case
    problem = Problem(_shape(e, h * 2, i * 2, k), m, dtype, seed=11)  # sizes multiples of 16 bytes
    target = Target.current()
    if reason := get_path("cutlass").supports(problem, target):
        pytest.skip(reason)
    result = check_point(get_path("cutlass"), problem, make_inputs(problem, DEVICE, draw=1))
    assert result.correct, f"rel. error {result.rel_err}"


@pytest.mark.skipif(not GPU, reason="compile caches exist on the GPU only")
def test_no_recompile_as_token_count_changes():
    """One compiled variant per tile config, whatever M: token counts are not specialized. Each GEMM has
    compiled at the first M (the check is not 0 == 0) and compiles nothing at the others."""
    from moebench.kernels import gemm1, gemm2
    from moebench.kernels.fused_moe import fused_moe

    def variants(fn) -> int:
        # device_caches[device][0] is the kernel cache in triton 3.6 through 3.9.
        return sum(len(c[0]) for c in fn.device_caches.values())

    problem = Problem(_shape(8, 256, 128, 2), 1, "bf16", seed=1)
    cfg = TileConfig(16, 64, 64, 1, 4, 3)
    counts = []
    for m in (1, 16, 17, 64, 333):
        inp = make_inputs(Problem(problem.shape, m, "bf16"), DEVICE)
        fused_moe(inp.x, inp.weights.w13, inp.weights.w2, inp.topk_weights, inp.topk_ids, cfg)
        torch.cuda.synchronize()
        counts.append((variants(gemm1._gemm1_swiglu), variants(gemm2._gemm2_combine)))
    assert all(n >= 1 for n in counts[0]), f"a GEMM compiled nothing: {counts[0]}"
    assert len(set(counts)) == 1, counts


@pytest.mark.parametrize("variant", [{}, {"swap_ab": True}, {"split_k": 2}])
@pytest.mark.parametrize("dtype", ["fp16", "fp8-tensor", "fp8-block128"] + (["bf16"] if GPU else []))
def test_gemm1_weights_by_tma_match_reference(dtype, variant):
    """GEMM1 reading its weight tiles through a tensor descriptor matches the reference where the tiles
    overhang: hidden 96 against 64- and 128-wide K steps (TMA reads zeros past K), I = 48 against 32
    columns (the second tile's last rows are up rows or the next expert's, whose columns are masked)."""
    problem = Problem(_shape(6, 96, 48, 2), 33, dtype, seed=9)
    inputs = make_inputs(problem, DEVICE, draw=1)
    block_k = 128 if dtype == "fp8-block128" else 64
    config = TileConfig(16, 32, block_k, 1, 4, 2, gemm1_tma=True, **variant)
    result = check_point(get_path("triton"), problem, inputs, config)
    assert result.correct, f"rel. error {result.rel_err}"


def test_gemm1_tma_is_refused_with_the_merged_mma():
    with pytest.raises(UserError, match="gemm1_tma"):
        TileConfig(16, 32, 64, gemm1_tma=True, gemm1_merged=True)


# fp16: the unscaled form; fp8-tensor's h scale is one number to GEMM2 whether static or dynamic
@pytest.mark.parametrize("dtype", [d for d in TRITON_DTYPES if d not in ("fp32", "fp8-tensor-static")])
def test_gemm2_split_k_matches_reference(dtype):
    """GEMM2 split-K (``gemm2_split_k``: each program adds its share of the K steps by the atomic top-k
    sum) matches the fp32 reference in fp16 and each fp8 scale scheme, plain and Swap-AB, with a K tail
    (I = 48 over steps of 32 at fp16 and fp8, or the block128 group of 128) and more splits than steps."""
    problem = Problem(_shape(6, 96, 48, 2), 5, dtype, seed=6)
    inputs = make_inputs(problem, DEVICE, draw=1)
    block_k = 128 if dtype == "fp8-block128" else 32
    for swap_ab, split in ((False, 2), (True, 2), (False, 4)):
        config = TileConfig(16, 32, block_k, 1, 4, 2, swap_ab=swap_ab, gemm2_split_k=split)
        result = check_point(get_path("triton"), problem, inputs, config)
        assert result.correct, f"swap {swap_ab}, {split} splits: rel. error {result.rel_err}"


def test_gemm2_split_k_needs_the_atomic_sum_and_one_column_tile():
    for bad in (dict(atomic_sum=False), dict(gemm2_n_tiles=2)):
        with pytest.raises(UserError, match="gemm2_split_k"):
            TileConfig(16, 32, 64, gemm2_split_k=2, **bad)


def test_topk_sum_into_the_output_needs_the_atomic_sum():
    with pytest.raises(UserError, match="atomic_out"):
        TileConfig(16, 32, 64, atomic_sum=False, atomic_out=True)


@pytest.mark.parametrize("dtype", ["fp16", "fp8-channel", "fp8-block128"] + (["bf16"] if GPU else []))
@pytest.mark.parametrize("case", [CASES[2], CASES[3]])
def test_stored_topk_sum_matches_reference(case, dtype):
    """GEMM2 storing each slot's row and summing after gives the same layer as the atomic epilogue."""
    e, h, i, k, m = case
    problem = Problem(_shape(e, h, i, k), m, dtype, seed=4)
    path = get_path("triton")
    config = replace(path.default_config(problem), atomic_sum=False)
    result = check_point(path, problem, make_inputs(problem, DEVICE, draw=1), config)
    assert result.correct, f"rel. error {result.rel_err}"


@pytest.mark.parametrize("dtype", ["fp16", "fp8-tensor", "fp8-tensor-static", "fp8-block128"] + (
    ["bf16"] if GPU else []))
@pytest.mark.parametrize("swap_ab", [False, True])
def test_split_k_matches_reference(dtype, swap_ab):
    """GEMM1 split over K (partial sums, then the activation) gives the layer of the fused epilogue."""
    problem = Problem(_shape(8, 512, 64, 2), 3, dtype, seed=6)  # 4 K steps of 128, few programs
    path = get_path("triton")
    config = replace(path.default_config(problem), BLOCK_SIZE_K=128, swap_ab=swap_ab, split_k=2)
    result = check_point(path, problem, make_inputs(problem, DEVICE, draw=1), config)
    assert result.correct, f"rel. error {result.rel_err}"


def test_triton_path_refuses_a_block128_config_without_128_wide_k_steps():
    """fp8-block128 with a K step that is not one 128-wide scale block is refused in one line."""
    path = get_path("triton")
    block = Problem(_shape(8, 128, 64, 2), 4, "fp8-block128")
    with pytest.raises(UserError, match="BLOCK_SIZE_K=128"):
        path.prepare(make_inputs(block, DEVICE), block, TileConfig(16, 64, 64, 1, 4, 2))


# Routing cases at fp16 (M = 1; top-k = E, 2 tokens: every expert serves 2 tiles; experts with no token), and the
# top-k = E case at each fp8 scale scheme: the routing is the dtype's business nowhere but in the scales each slot
# reads.
TOPK_E = (8, 128, 64, 8, 2)
DIRECT_CASES = [(c, "fp16") for c in (CASES[0], TOPK_E, CASES[4])] + [
    (TOPK_E, d) for d in ["fp8-tensor", "fp8-block128"] + (["bf16"] if GPU else [])]


@pytest.mark.parametrize("case, dtype", DIRECT_CASES)
def test_direct_route_matches_reference(case, dtype):
    """A tile per token slot, read from topk_ids with no align step, gives the layer; with top-k = E
    every expert serves several tiles. Plain and Swap-AB, both top-k sums, with and without split-K."""
    e, h, i, k, m = case
    problem = Problem(_shape(e, h, i, k), m, dtype, seed=8)
    inputs = make_inputs(problem, DEVICE, draw=1)
    if k == e:  # the case has what it claims: every expert serves several tiles (one per slot)
        assert m >= 2 and (torch.bincount(inputs.topk_ids.flatten().long().cpu(), minlength=e) == m).all()
    path = get_path("triton")
    base = replace(path.default_config(problem), direct_route=True)
    for config in (base, replace(base, swap_ab=True, atomic_sum=False), replace(base, swap_ab=True, split_k=2)):
        result = check_point(path, problem, inputs, config)
        assert result.correct, f"{config}: rel. error {result.rel_err}"


@pytest.mark.parametrize("dtype", ["fp16", "fp8-channel", "fp8-block128"] + (["bf16"] if GPU else []))
def test_gemm2_preload_matches_reference(dtype):
    """GEMM2 with its first two K steps' weights read before it waits (``gemm2_preload``): two, three and five
    K steps, with and without a K tail, GEMM2 split-K (splits of two, one and no steps), plain and Swap-AB."""
    block = dtype == "fp8-block128"
    e, h, i, k, m = (8, 128, 320, 2, 3) if block else (8, 64, 160, 2, 3)  # GEMM2's K = I
    problem = Problem(_shape(e, h, i, k), m, dtype, seed=21)
    inputs = make_inputs(problem, DEVICE, draw=1)
    path = get_path("triton")
    base = TileConfig(16, 64, 128 if block else 32, 1, 4, 2, direct_route=True, gemm2_preload=True)
    # block128: 3 steps, the last half full; else 5 steps of 32 (4 splits of 2, 2, 1 and none)
    configs = [base, replace(base, swap_ab=True), replace(base, gemm2_split_k=4)]
    if not block:  # 3 steps, the last half full; 2 steps, the second a quarter
        configs += [replace(base, BLOCK_SIZE_K=64, swap_ab=True), replace(base, BLOCK_SIZE_K=128)]
    # the case has what it claims: GEMM2's K steps (full steps, then the tail's width) as the comments say
    steps = [(i // c.BLOCK_SIZE_K, i % c.BLOCK_SIZE_K) for c in configs]
    assert steps == ([(2, 64)] * 3 if block else [(5, 0)] * 3 + [(2, 32), (1, 32)])
    for config in configs:
        result = check_point(path, problem, inputs, config)
        assert result.correct, f"{config}: rel. error {result.rel_err}"


def test_gemm2_preload_needs_direct_route_and_one_column_tile():
    """``gemm2_preload`` is a form of the tile per slot, for GEMM2 programs of one column tile."""
    with pytest.raises(UserError, match="gemm2_preload"):
        TileConfig(16, 64, 128, gemm2_preload=True)
    with pytest.raises(UserError, match="gemm2_preload"):
        TileConfig(16, 64, 128, direct_route=True, gemm2_n_tiles=2, gemm2_preload=True)


# Slots per expert for the tail-tile tests, at BLOCK_M = 64: a whole tile and a tail of 10 (a quarter tile), 16 (a
# quarter, exactly), none, 30 (a half) and 33 (full); 153 tokens at top-k = 1.
TAIL_COUNTS = (74, 16, 0, 30, 33)


def _tail_inputs(problem: Problem):
    """Inputs whose token i goes to the expert of ``TAIL_COUNTS`` in a fixed shuffled order (top-k = 1)."""
    inputs = make_inputs(problem, DEVICE, draw=1)
    ids = torch.repeat_interleave(torch.arange(len(TAIL_COUNTS)), torch.tensor(TAIL_COUNTS))
    ids = ids[torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(0))]
    return replace(inputs, topk_ids=ids.to(torch.int32).view(-1, 1).to(DEVICE))


@pytest.mark.parametrize("dtype", ["fp16", "fp8-channel", "fp8-block128"] + (["bf16"] if GPU else []))
def test_tail_tiles_match_reference(dtype):
    """An expert's last row tile at half or a quarter of BLOCK_M rows (``tail_tiles``): experts whose tails
    take a quarter, a half and a whole tile, one with none, E = 5, hidden and I with a K and column tail;
    plain and Swap-AB, the stored top-k sum, GEMM2 walking two column tiles, split-K and a merged GEMM1 at fp16;
    the fp8 scale schemes (scales read per tail row, or per column with Swap-AB) plain, Swap-AB and split-K."""
    block = dtype == "fp8-block128"
    hidden, inter = (192, 192) if block else (80, 80)
    problem = Problem(_shape(len(TAIL_COUNTS), hidden, inter, 1), sum(TAIL_COUNTS), dtype, seed=23)
    inputs = _tail_inputs(problem)
    base = TileConfig(64, 32, 128 if block else 32, 1, 4, 2, tail_tiles=2)
    # the case has what it claims: quarter, half and whole tails, an expert with none and one with a whole tile
    # before its tail; hidden and I not multiples of the K step (a K tail in both GEMMs) nor I of the column tile
    heights = {16 if t <= 16 else 32 if t <= 32 else 64 for t in (n % 64 for n in TAIL_COUNTS) if t}
    assert heights == {16, 32, 64} and 0 in TAIL_COUNTS and any(n > 64 and n % 64 for n in TAIL_COUNTS)
    assert hidden % base.BLOCK_SIZE_K and inter % base.BLOCK_SIZE_K and (block or inter % base.BLOCK_SIZE_N)
    configs = [base, replace(base, tail_tiles=1, swap_ab=True), replace(base, split_k=2)]
    if dtype == "fp16":
        configs += [replace(base, swap_ab=True, atomic_sum=False), replace(base, gemm2_n_tiles=2),
                    replace(base, gemm1_merged=True)]
    for config in configs:
        result = check_point(get_path("triton"), problem, inputs, config)
        assert result.correct, f"{config}: rel. error {result.rel_err}"


def test_tail_tiles_need_tiles_of_16_rows_and_the_align_step():
    """``tail_tiles`` halves BLOCK_M once or twice, to no fewer than 16 rows, and is for the align's tiles."""
    assert TileConfig(64, 64, 64, tail_tiles=2).tail_tiles == 2
    for bad in (dict(BLOCK_SIZE_M=32, tail_tiles=2), dict(BLOCK_SIZE_M=16, tail_tiles=1),
                dict(BLOCK_SIZE_M=128, tail_tiles=3), dict(BLOCK_SIZE_M=64, tail_tiles=1, direct_route=True)):
        with pytest.raises(UserError, match="tail_tiles"):
            TileConfig(BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, **bad)


@pytest.mark.skipif(not GPU, reason="CUDA graphs and programmatic dependent launch need a GPU")
@pytest.mark.parametrize("dtype", ["bf16", "fp8-block128", "fp8-tensor"])
@pytest.mark.parametrize("variant", [{"split_k": 2}, {"atomic_sum": False}, {"gemm2_preload": True},
                                     {"gemm2_preload": True, "split_k": 2, "gemm2_split_k": 2}])
def test_direct_route_replayed_from_a_cuda_graph_matches_reference(dtype, variant):
    """With a tile per slot, every Triton launch of the layer (activation quantization, the GEMMs, the
    split-K activation, the top-k sum) is a programmatic dependent on sm90: each program may start before
    the previous launch ends and waits for it before reading its output. Replayed from a CUDA graph with
    fresh activations and routing each time, the layer still matches the reference at every replay."""
    from moebench.kernels.fused_moe import fused_moe
    from moebench.routing import route

    problem = Problem(_shape(64, 512, 256, 8), 2, dtype, seed=11)
    inp = make_inputs(problem, DEVICE, draw=1)
    w = inp.weights
    cfg = TileConfig(16, 64, 128, 1, 4, 3, swap_ab=True, direct_route=True, **variant)
    out = torch.empty(2, 512, device=DEVICE, dtype=problem.spec.act)
    compiled: list = []

    def run(kernels: list | None = None) -> None:
        fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, cfg, out=out, fp8_scheme=w.fp8_scheme,
                  w13_scale=w.w13_scale, w2_scale=w.w2_scale, compiled=kernels)

    run(compiled)
    if torch.cuda.get_device_capability()[0] >= 9:
        assert all(k.metadata.launch_pdl for k in compiled)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for seed in range(3):
        inp.x.copy_(torch.randn(inp.x.shape, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(seed)))
        topk_weights, topk_ids = route(2, 64, 8, "uniform", seed, DEVICE)
        inp.topk_weights.copy_(topk_weights)
        inp.topk_ids.copy_(topk_ids)
        out.fill_(float("nan"))
        graph.replay()
        ref = moe_reference(inp.x, w, inp.topk_weights, inp.topk_ids)
        rel = torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref)
        assert rel < problem.spec.rtol, f"replay {seed}: rel. error {rel}"


def test_static_scales_quantize_x_once_and_h_in_gemm1(monkeypatch):
    """fp8-tensor-static: x is quantized at its given scale in one launch and GEMM1's epilogue writes h
    in fp8 (no second quantization); the layer matches the reference and the dynamic scheme's."""
    from moebench.kernels import fused_moe as fm

    calls = []

    def counted(t, scheme, static_scale=None, pdl=False, maxima=None, zero=None, **kw):
        calls.append((tuple(t.shape), static_scale is not None))
        return quantize_act(t, scheme, static_scale, pdl, maxima, zero, **kw)

    monkeypatch.setattr(fm, "quantize_act", counted)
    problem = Problem(_shape(8, 128, 64, 2), 5, "fp8-tensor-static", seed=10)
    inputs = make_inputs(problem, DEVICE, draw=1)
    assert inputs.weights.act_scale.shape == (2,) and (inputs.weights.act_scale > 0).all()
    result = check_point(get_path("triton"), problem, inputs, TileConfig(16, 32, 32, 1, 4, 2))
    assert result.correct, f"rel. error {result.rel_err}"
    assert calls == [((5, 128), True)]
    dynamic = make_inputs(Problem(problem.shape, 5, "fp8-tensor", seed=10), DEVICE, draw=1)
    assert torch.equal(dynamic.weights.w13.float(), inputs.weights.w13.float())  # same weights, other scales


SPLIT_H_QUANT = [TileConfig(16, 64, 128, 1, 4, 2, split_k=2),
                 TileConfig(16, 64, 128, 1, 4, 2, swap_ab=True, split_k=2, direct_route=True)]
EPILOGUE_H_QUANT = [
    TileConfig(16, 128, 128, 1, 4, 2),  # 128-wide GEMM1 tiles: its epilogue quantizes h
    TileConfig(16, 128, 128, 1, 4, 2, swap_ab=True, direct_route=True),
    TileConfig(16, 128, 128, 1, 4, 2, gemm1_tma=True),  # TMA tiles past N hold other rows: kept out of the max
    TileConfig(16, 128, 128, 1, 4, 2, gemm1_merged=True, atomic_sum=False),
]


# I = 200: 2 groups, the last partly outside h; I = 1100: 9 groups over the split-K activation launch's 2 column
# chunks of 1024, once (that launch is the same whatever GEMM1's form; GEMM1's epilogue sees one tile at a time).
@pytest.mark.parametrize("config, intermediate", [(SPLIT_H_QUANT[0], 1100)] + [
    (c, 200) for c in SPLIT_H_QUANT + EPILOGUE_H_QUANT])
def test_block128_h_quantized_by_the_launch_that_applies_the_activation(config, intermediate, monkeypatch):
    """fp8-block128's h is quantized where the activation is applied: after a split-K GEMM1 by the launch
    that adds the splits, with 128-wide tiles by GEMM1's epilogue (each tile row is one 1x128 group).
    quantize_act runs once (for x), not twice, and the layer matches the reference."""
    from moebench.kernels import fused_moe as fm

    calls = []

    def counted(t, scheme, static=None, pdl=False, maxima=None, zero=None, **kw):
        calls.append(t.shape)
        return quantize_act(t, scheme, static, pdl, maxima, zero, **kw)

    monkeypatch.setattr(fm, "quantize_act", counted)
    problem = Problem(_shape(4, 256, intermediate, 2), 3, "fp8-block128", seed=9)  # 2 K steps: 1 per split
    if intermediate > 1024:  # the case has what it claims: split-K's activation launch, columns in 2 chunks of 1024
        assert config.split_k > 1 and 1024 < intermediate <= 2048
    result = check_point(get_path("triton"), problem, make_inputs(problem, DEVICE, draw=1), config)
    assert result.correct, f"rel. error {result.rel_err}"
    assert [tuple(shape) for shape in calls] == [(3, 256)]


@pytest.mark.parametrize("config", [
    TileConfig(16, 32, 32, 1, 4, 2),
    TileConfig(16, 32, 32, 1, 4, 2, swap_ab=True, atomic_sum=False),
    TileConfig(32, 32, 32, 1, 4, 2, tail_tiles=1),  # tail tiles: one of the tile paths writes each maximum
    TileConfig(16, 32, 32, 1, 4, 2, gemm1_merged=True),
    TileConfig(16, 32, 32, 1, 4, 2, direct_route=True),
    TileConfig(16, 32, 32, 1, 4, 2, split_k=2),  # split-K: the _swiglu launch writes h, its maximum found after
])
def test_fp8_tensor_scale_of_h_from_gemm1_tile_maxima(config, monkeypatch):
    """fp8-tensor with a dynamic scale: without split-K each GEMM1 program writes the maximum of its tile of h
    (programs past the used tiles a zero), and h's quantization takes the largest, with no launch reading h for
    it: the scale is h's own maximum / 448 and the layer matches the reference."""
    from moebench.kernels import fused_moe as fm

    seen = []

    def recorded(t, scheme, static=None, pdl=False, maxima=None, zero=None, **kw):
        q, scale = quantize_act(t, scheme, static, pdl, maxima, zero, **kw)
        seen.append((t.clone(), maxima, scale.clone()))
        return q, scale

    monkeypatch.setattr(fm, "quantize_act", recorded)
    problem = Problem(_shape(6, 96, 48, 2), 17, "fp8-tensor", seed=14)
    result = check_point(get_path("triton"), problem, make_inputs(problem, DEVICE, draw=1), config)
    assert result.correct, f"rel. error {result.rel_err}"
    h, maxima, scale = seen[-1]  # the last run's h (seen[0] and [1]: x and h of the first)
    assert h.shape == (17 * 2, 48)
    assert (maxima is None) == (config.split_k > 1)
    assert torch.equal(scale, (h.float().abs().max() / 448.0).reshape(1))


QUANT_X = [
    TileConfig(16, 64, 128, 1, 4, 2, swap_ab=True, direct_route=True),
    TileConfig(16, 64, 128, 1, 4, 2, direct_route=True, atomic_sum=False),
    TileConfig(16, 64, 128, 1, 4, 2, swap_ab=True, direct_route=True, split_k=2),
]


# hidden = 320: 3 groups, the last half outside x (a K tail), every config; 384: 3 whole groups, the first config
@pytest.mark.parametrize("config, hidden", [(QUANT_X[0], 384)] + [(c, 320) for c in QUANT_X])
def test_block128_x_quantized_in_gemm1_gives_the_same_bits(config, hidden, monkeypatch):
    """With ``gemm1_quant_x`` GEMM1 quantizes x's 1x128 groups in its K loop and no launch does it first;
    the layer's output is bit for bit the one with the launch, plain, Swap-AB and split-K."""
    from moebench.kernels import fused_moe as fm

    calls = []

    def counted(t, scheme, static=None, pdl=False, maxima=None, zero=None, **kw):
        calls.append(tuple(t.shape))
        return quantize_act(t, scheme, static, pdl, maxima, zero, **kw)

    monkeypatch.setattr(fm, "quantize_act", counted)
    problem = Problem(_shape(8, hidden, 128, 2), 3, "fp8-block128", seed=12)
    inp = make_inputs(problem, DEVICE, draw=1)
    w = inp.weights
    outs = []
    for quant_x in (True, False):
        calls.clear()
        out = torch.full((3, hidden), float("nan"), device=DEVICE, dtype=problem.spec.act)
        fm.fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, replace(config, gemm1_quant_x=quant_x),
                     out=out, fp8_scheme="block128", w13_scale=w.w13_scale, w2_scale=w.w2_scale)
        outs.append(out)
        assert ((3, hidden) in calls) != quant_x  # x quantized by a launch only without the field
    assert torch.isfinite(outs[0]).all()
    assert torch.equal(outs[0], outs[1])


def test_gemm1_quant_x_is_refused_off_block128_and_without_direct_route():
    """``gemm1_quant_x`` needs a tile per slot and fp8-block128: anything else is refused in one line."""
    with pytest.raises(UserError, match="direct_route"):
        TileConfig(16, 64, 128, gemm1_quant_x=True)
    problem = Problem(_shape(8, 128, 64, 2), 2, "fp8-tensor")
    with pytest.raises(UserError, match="fp8-block128"):
        get_path("triton").prepare(make_inputs(problem, DEVICE), problem,
                                   TileConfig(16, 64, 128, direct_route=True, gemm1_quant_x=True))


# I = 192 (up rows from mid-block, a K tail in GEMM2) with every variant; I = 256 (blocks aligned) plain.
@pytest.mark.parametrize("variant, intermediate", [({}, 256)] + [
    (v, 192) for v in ({}, {"split_k": 2}, {"gemm2_block_n": 128}, {"gemm2_n_tiles": 4}, {"gemm1_merged": True},
                       {"BLOCK_SIZE_N": 128})])
@pytest.mark.parametrize("swap_ab", [False, True])
def test_block128_scales_that_differ_by_orders_between_k_groups(swap_ab, variant, intermediate):
    """Each K step applies its own 128x128-block scales: with activation and weight groups whose scales
    differ by up to 1e5 (each group's products kept O(1)), the layer matches the reference, plain and
    Swap-AB, with split-K (h's groups then quantized by the activation launch), with 128-wide tiles (by
    GEMM1's epilogue), with GEMM2 wider, with GEMM2 walking 4 column tiles per program (6 tiles: the second
    program's last two lie past N) and with GEMM1's gate and up rows in one MMA (each B column scaled by its
    own row's block).

    The 64-wide tiles divide I, so GEMM1 reads one gate and one up scale per tile and K step; at I = 192
    the up rows start mid-block (rows 192-255 in block 1, 256-383 in block 2) and GEMM2's K has a tail."""
    from moebench.kernels.fused_moe import fused_moe
    from moebench.problem import Weights
    from moebench.quant import quantize_weight
    from moebench.routing import route

    E, H, I, topk, M = 4, 384, intermediate, 2, 9
    act = DTYPES["fp8-block128"].act
    gen = torch.Generator(device=DEVICE).manual_seed(21)
    per_h = (10.0 ** torch.tensor([-3.0, 0.0, 2.0], device=DEVICE)).repeat_interleave(128)  # [H]
    per_i = (10.0 ** torch.tensor([-2.0, 1.0], device=DEVICE)).repeat_interleave(128)[:I]  # [I]
    per_rows = (10.0 ** torch.tensor([0.0, -1.0, 1.0, 0.5], device=DEVICE)).repeat_interleave(128)[:2 * I]  # [2I]
    x = (torch.randn(M, H, generator=gen, device=DEVICE) * per_h).to(act)
    w13 = torch.randn(E, 2 * I, H, generator=gen, device=DEVICE) * H**-0.5 / per_h * per_rows[:, None]
    w2 = torch.randn(E, H, I, generator=gen, device=DEVICE) * I**-0.5 / per_i
    q13, s13 = quantize_weight(w13.to(act), "block128")
    q2, s2 = quantize_weight(w2.to(act), "block128")
    weights = Weights(q13, q2, s13, s2, "block128")
    topk_weights, topk_ids = route(M, E, topk, "uniform", 21, DEVICE)

    out = torch.full((M, H), float("nan"), device=DEVICE, dtype=act)
    cfg = replace(TileConfig(16, 64, 128, 1, 4, 2, swap_ab=swap_ab), **variant)
    fused_moe(x, q13, q2, topk_weights, topk_ids, cfg, out=out, fp8_scheme="block128", w13_scale=s13, w2_scale=s2)
    ref = moe_reference(x, weights, topk_weights, topk_ids)
    assert torch.isfinite(out).all()
    rel = torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref)
    assert rel < DTYPES["fp8-block128"].rtol, f"rel. error {rel}"


@pytest.mark.parametrize("config", [
    TileConfig(16, 32, 32, 1, 4, 2),  # atomic top-k sum
    TileConfig(16, 32, 32, 1, 4, 2, swap_ab=True, direct_route=True, split_k=3),  # split-K partial sums
    TileConfig(16, 32, 32, 1, 4, 2, atomic_sum=False, gemm2_n_tiles=2),  # stored rows, then the sum launch
])
def test_layer_reads_no_memory_it_did_not_write(config, monkeypatch):
    """Every buffer the layer takes from torch.empty starts as garbage (all bytes 0xFF: NaN floats, -1
    integers) and the layer still matches the reference: no launch reads what no launch wrote."""
    from moebench.kernels import fused_moe as fm

    garbage_from_empty(monkeypatch)
    problem = Problem(_shape(6, 96, 48, 2), 17, "fp32", seed=13)
    inp = make_inputs(problem, DEVICE, draw=1)
    w = inp.weights
    out = fm.fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, config)
    ref = moe_reference(inp.x, w, inp.topk_weights, inp.topk_ids)
    assert torch.isfinite(out).all()
    assert torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref) < DTYPES["fp32"].rtol


@pytest.mark.parametrize("in_gemm1", [True, False])
@pytest.mark.parametrize("config", [
    TileConfig(16, 32, 512, 1, 4, 2),  # the float32 sums
    TileConfig(16, 32, 512, 1, 4, 2, atomic_out=True, swap_ab=True),  # the output itself
])
def test_gemm1_zeroes_sums_of_many_blocks_per_program(config, in_gemm1, monkeypatch):
    """GEMM1's programs zero GEMM2's atomic sums, whatever the poisoned output held: here [9, 4000] (35
    whole blocks of 1024 and a partial one) over a grid of 3 programs, so each zeroes a run of 12 blocks
    (the last one 11) and program 0 the partial block too. Sums larger than ZERO_IN_GEMM1_BYTES (here set
    to 0) are zeroed by a launch before GEMM1 (that case at [9, 320]: one launch zeroes them whatever their size)."""
    from moebench.kernels import fused_moe as fm
    from moebench.kernels.fused_moe import fused_moe

    if not in_gemm1:
        monkeypatch.setattr(fm, "ZERO_IN_GEMM1_BYTES", 0)

    hidden = 4000 if in_gemm1 else 320
    problem = Problem(_shape(2, hidden, 32, 1), 9, "fp16", seed=4)
    inp = make_inputs(problem, DEVICE, draw=1)
    w = inp.weights
    out = torch.full((9, hidden), float("nan"), device=DEVICE, dtype=torch.float16)
    fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, config, out=out)
    ref = moe_reference(inp.x, w, inp.topk_weights, inp.topk_ids)
    assert torch.isfinite(out).all()
    assert torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref) < DTYPES["fp16"].rtol


def test_block128_x_quantization_zeroes_sums_too_large_for_gemm1(monkeypatch):
    """At fp8-block128, sums larger than ZERO_IN_GEMM1_BYTES (here set to 0) are zeroed by x's quantization
    launch, each program the tile of the sums at its tile of x, with no launch of their own: the float32 sums
    start as garbage (all bytes 0xFF), [40, 320] over tiles of 32 rows and 128 columns (the last ones partial),
    and the layer still matches the reference with ``Tensor.zero_`` refused."""
    from moebench.kernels import fused_moe as fm

    def no_zero_launch(self):
        raise AssertionError("the sums were zeroed by a launch of their own")

    monkeypatch.setattr(fm, "ZERO_IN_GEMM1_BYTES", 0)
    garbage_from_empty(monkeypatch)
    monkeypatch.setattr(torch.Tensor, "zero_", no_zero_launch)
    problem = Problem(_shape(4, 320, 64, 2), 40, "fp8-block128", seed=5)
    inp = make_inputs(problem, DEVICE, draw=1)
    w = inp.weights
    config = TileConfig(16, 32, 128, 1, 4, 2)  # the float32 sums, then a cast into the output
    out = fm.fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, config, fp8_scheme="block128",
                       w13_scale=w.w13_scale, w2_scale=w.w2_scale)
    ref = moe_reference(inp.x, w, inp.topk_weights, inp.topk_ids)
    assert torch.isfinite(out).all()
    assert torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref) < DTYPES["fp8-block128"].rtol
