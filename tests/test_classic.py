"""The triton-classic path (the engines' kernel form, ``kernels/classic.py``) against the float32 reference.

On the CPU its kernels run under the interpreter in fp16 and fp32, and in fp8 with bf16 activations (fp8
dots are right there, and the dtype specs give fp8 bf16 activations). fp8 is also checked against the same
arithmetic in torch (the same activation quantization, x's dtype between the launches): the fp8 tolerance
alone would let a misplaced scale group through.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers import declared_do_not_specialize, garbage_from_empty
from point_checks import check_point

from moebench._interpret import interpreting
from moebench.errors import UserError
from moebench.kernels import classic
from moebench.kernels.act_quant import quantize_act
from moebench.kernels.align import max_padded_len, moe_align
from moebench.models import MoEShape
from moebench.paths.base import Target
from moebench.paths.registry import get_path
from moebench.paths.torch_ref import moe_reference
from moebench.problem import MoEInputs, Problem, make_inputs
from moebench.quant import dequantize_weight
from moebench.tables.table import ENGINE_DOWN_PATH
from moebench.tile import TileConfig

GPU = torch.cuda.is_available() and not interpreting()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PATH = get_path("triton-classic")


def _problem(e: int, h: int, i: int, k: int, m: int, dtype: str, seed: int = 3) -> Problem:
    return Problem(MoEShape("test", e, h, i, k), m, dtype, seed=seed)


# (experts, hidden, intermediate, topk, M, config)
CASES = [
    (8, 128, 64, 2, 1, TileConfig(16, 32, 64, 1, 4, 2)),  # M = 1, T < BLOCK_M: each tile mostly padding
    (4, 64, 32, 2, 40, TileConfig(16, 32, 32, 1, 4, 2)),  # 20 slots per expert: several row tiles each
    (6, 96, 48, 2, 33, TileConfig(16, 64, 64, 4, 4, 2)),  # row tiles in groups of 4; 2I, hidden and I not
    # multiples of the tile (GEMM1: 96 columns over 64, K 96 over 64; GEMM2: 96 over 64, K 48 over 64)
]


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("case", CASES, ids=["M1", "rows-per-expert", "group-and-tails"])
def test_classic_matches_reference(case, dtype, monkeypatch):
    """The layer matches the fp32 reference, and every cache element it reads was written (caches start NaN)."""
    e, h, i, k, m, config = case
    problem = _problem(e, h, i, k, m, dtype)
    inputs = make_inputs(problem, DEVICE, draw=1)
    if m == 40:  # the case's precondition: an expert's slots span several row tiles
        busiest = int(torch.bincount(inputs.topk_ids.reshape(-1).long(), minlength=e).max())
        assert busiest > config.BLOCK_SIZE_M, busiest
    garbage_from_empty(monkeypatch)
    result = check_point(PATH, problem, inputs, config)
    assert result.correct, f"rel. error {result.rel_err}"


def test_grouped_order_reaches_a_partial_last_group():
    """Row tiles in groups of GROUP_SIZE_M where the last group is short and in use: top-1 routing with 17, 17
    and 1 slots fills all 5 row tiles of the grid's bound (17 = 16 + 1 pads to 2 tiles), so the groups are 4
    and 1, and the fifth tile's columns come only from the short group's programs."""
    problem = _problem(3, 96, 48, 1, 35, "fp16", seed=7)
    inputs = make_inputs(problem, DEVICE, draw=1)
    ids = torch.tensor([0] * 17 + [1] * 17 + [2], dtype=torch.int32)
    ids = ids[torch.randperm(35, generator=torch.Generator().manual_seed(0))].view(35, 1).to(DEVICE)
    inputs = replace(inputs, topk_ids=ids)
    config = TileConfig(16, 32, 64, 4, 4, 2)
    used = int(moe_align(ids, 3, 16).num_padded) // 16
    assert used == max_padded_len(35, 3, 16) // 16 == 5  # the precondition: every tile of the bound in use
    result = check_point(PATH, problem, inputs, config)
    assert result.correct, f"rel. error {result.rel_err}"


def _stored(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 ``t`` as a kernel stores it in ``dtype``, back in float32. The Triton interpreter casts float32 to
    bf16 by dropping the low 16 bits (a GPU rounds to nearest even)."""
    if dtype == torch.bfloat16 and interpreting():
        return (t.float().view(torch.int32) & -65536).view(torch.float32)
    return t.to(dtype).float()


def _emulated(inputs: MoEInputs) -> torch.Tensor:
    """The layer as the classic path computes it, in float32 torch: x and cache2 quantized by the same
    ``quantize_act``, fp8 values dequantized, cache1, cache2 and cache3 stored in x's dtype. [M, hidden]"""
    w, x = inputs.weights, inputs.x
    scheme, static = w.fp8_scheme, w.act_scale
    M, topk = inputs.topk_ids.shape
    I = w.w2.shape[2]

    def act(a: torch.Tensor, scale_at: slice) -> torch.Tensor:  # a [R, K] -> its fp8 value in float32
        q, s = quantize_act(a, scheme, None if static is None else static[scale_at])
        if scheme == "block128":
            return q.float() * s.repeat_interleave(128, 1)[:, : a.shape[1]]
        return q.float() * (s if s.numel() == 1 else s[:, None])

    def weights(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:  # [E, N, K] float32
        return torch.stack([dequantize_weight(q[j], s[j], scheme) for j in range(q.shape[0])])

    expert = inputs.topk_ids.reshape(-1).long()  # [T]
    tok = torch.arange(M * topk, device=x.device) // topk  # [T]
    a1 = act(x, slice(0, 1))[tok]  # [T, H]
    cache1 = _stored(torch.bmm(weights(w.w13, w.w13_scale)[expert], a1[:, :, None])[:, :, 0], x.dtype)  # [T, 2I]
    cache2 = _stored(F.silu(cache1[:, :I]) * cache1[:, I:], x.dtype).to(x.dtype)  # [T, I]
    a2 = act(cache2, slice(1, 2))
    cache3 = torch.bmm(weights(w.w2, w.w2_scale)[expert], a2[:, :, None])[:, :, 0]  # [T, H]
    cache3 = _stored(cache3 * inputs.topk_weights.reshape(-1, 1), x.dtype)
    return cache3.view(M, topk, -1).sum(1)


@pytest.mark.parametrize("dtype", ["fp8-tensor", "fp8-tensor-static", "fp8-channel", "fp8-block128"])
def test_classic_fp8_matches_reference_and_its_arithmetic(dtype):
    """Each fp8 scheme matches the fp32 reference within its tolerance and the same quantized arithmetic in
    torch within 1e-2. hidden 256 and 2I 320 span two 128-wide scale groups and weight blocks, walked in K
    steps of 64 (two per group); I 160 ends in a partial group; 2I and hidden are not tile multiples."""
    problem = _problem(4, 256, 160, 2, 9, dtype, seed=5)
    inputs = make_inputs(problem, DEVICE, draw=1)
    config = TileConfig(16, 64, 64, 2, 4, 2)  # GEMM1's 320 columns in 5 tiles, GEMM2's 256 in 4
    out = torch.full((9, 256), float("nan"), device=DEVICE, dtype=problem.spec.act)
    PATH.prepare(inputs, problem, config)(out)
    ref = moe_reference(inputs.x, inputs.weights, inputs.topk_weights, inputs.topk_ids)
    rel = torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref)
    assert rel < problem.spec.rtol, f"against the reference: rel. error {rel}"
    same = _emulated(inputs)
    rel_same = torch.linalg.vector_norm(out.float() - same) / torch.linalg.vector_norm(same)
    assert rel_same < 1e-2, f"against the same arithmetic: rel. error {rel_same}"


@pytest.mark.parametrize("dtype", ["fp16", "fp8-block128"])
def test_default_config_runs_and_is_an_engine_config(dtype):
    """The untuned default at decode (M <= E) and prefill (M > E) is a config the engines run as written,
    accepted for the scheme, and the layer at it matches the reference."""
    decode, prefill = _problem(8, 128, 64, 2, 1, dtype), _problem(8, 128, 64, 2, 24, dtype)
    for problem in (decode, prefill):
        config = PATH.default_config(problem)
        assert config.portable
        classic.check_config(config, problem.spec.fp8_scheme)
    result = check_point(PATH, decode, make_inputs(decode, DEVICE, draw=1))  # config None: the default
    assert result.correct, f"rel. error {result.rel_err}"


@pytest.mark.parametrize("bad, match", [
    (TileConfig(16, 32, 64, swap_ab=True), "swap_ab"),  # a moebench-only field away from its default
    (TileConfig(16, 32, 64, atomic_sum=False), "atomic_sum"),  # the stored sum is moebench's too
])
def test_prepare_refuses_a_config_with_moebench_only_fields(bad, match):
    """This path reads the six engine keys only: a config that sets more is refused in one line naming them."""
    problem = _problem(8, 128, 64, 2, 4, "fp16")
    with pytest.raises(UserError, match=match):
        PATH.prepare(make_inputs(problem, DEVICE), problem, bad)


def test_prepare_refuses_block128_with_k_steps_across_scale_groups():
    """At fp8-block128 a K step of 256 would span two scale groups: refused, naming the rule; 64 is taken."""
    problem = _problem(8, 256, 128, 2, 4, "fp8-block128")
    inputs = make_inputs(problem, DEVICE)
    with pytest.raises(UserError, match="BLOCK_SIZE_K dividing 128"):
        PATH.prepare(inputs, problem, TileConfig(16, 64, 256))
    assert callable(PATH.prepare(inputs, problem, TileConfig(16, 64, 64)))


def test_path_is_registered_and_refuses_bf16_under_the_interpreter():
    """``get_path`` finds the path as a tunable, graph-safe non-baseline; like the triton path it refuses bf16
    under the interpreter (wrong dots) and takes fp16 there."""
    assert PATH.name == "triton-classic" and PATH.tunable and PATH.graph_safe and not PATH.baseline
    cpu = Target(torch.device("cpu"), True, None)
    assert PATH.supports(_problem(8, 128, 64, 2, 4, "bf16"), cpu)
    assert PATH.supports(_problem(8, 128, 64, 2, 4, "fp16"), cpu) is None


def test_the_down_path_runs_its_config_on_gemm2_alone(monkeypatch):
    """triton-classic-down (SGLang's ``_down`` tables): GEMM1 at the engines' default, GEMM2 at the config with
    GEMM1's BLOCK_SIZE_M (both read one align, as SGLang runs them); the layer matches the reference."""
    down = get_path("triton-classic-down")
    problem = _problem(6, 96, 48, 2, 33, "fp16")  # M > E: the default is 64 x 64 x 32
    config = TileConfig(16, 32, 64, 2, 4, 2)
    default = PATH.default_config(problem)
    assert config.BLOCK_SIZE_M != default.BLOCK_SIZE_M  # the precondition: GEMM2's BLOCK_SIZE_M is set
    seen: list[TileConfig] = []
    gemm = classic._gemm
    monkeypatch.setattr(classic, "_gemm", lambda *args: seen.append(args[-1]) or gemm(*args))
    result = check_point(down, problem, make_inputs(problem, DEVICE, draw=1), config)
    assert result.correct, f"rel. error {result.rel_err}"
    assert seen[:2] == [default, replace(config, BLOCK_SIZE_M=default.BLOCK_SIZE_M)]
    assert down.default_config(problem) == default
    assert down.name == ENGINE_DOWN_PATH  # the path a _down table's retime names, spelled once in each folder


def test_grouped_gemm_does_not_specialize_token_counts():
    """The two arguments that change with M (T and the grid's row-tile bound) are do_not_specialize, and the
    declared names are real parameters (Triton ignores a misspelled one)."""
    kernel = classic._grouped_gemm
    params = list(inspect.signature(kernel.fn).parameters)
    declared = declared_do_not_specialize(kernel)
    assert {"num_slots", "max_pid_m"} <= set(declared) <= set(params)


@pytest.mark.skipif(not GPU, reason="compile caches exist on the GPU only")
def test_no_recompile_as_token_count_changes():
    """GEMM1 and GEMM2 compile at the first M (two variants of one kernel) and nothing at the others."""

    def variants(fn) -> int:
        # device_caches[device][0] is the kernel cache in triton 3.6 through 3.9.
        return sum(len(c[0]) for c in fn.device_caches.values())

    config = TileConfig(16, 64, 64, 1, 4, 3)
    counts = []
    for m in (1, 16, 17, 333):
        problem = _problem(8, 256, 128, 2, m, "bf16", seed=1)
        inp = make_inputs(problem, DEVICE)
        out = torch.empty(m, 256, device=DEVICE, dtype=torch.bfloat16)
        classic.classic_moe(inp.x, inp.weights.w13, inp.weights.w2, inp.topk_weights, inp.topk_ids, config, out=out)
        torch.cuda.synchronize()
        counts.append((variants(classic._grouped_gemm), variants(classic._silu_and_mul)))
    assert counts[0][0] >= 2 and counts[0][1] >= 1, f"a kernel compiled nothing: {counts[0]}"
    assert len(set(counts)) == 1, counts

