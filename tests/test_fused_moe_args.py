"""``moebench.fused_moe`` with vLLM's fused-experts arguments, against the float32 reference: ``expert_map``
(global ids, local weights, remote slots adding nothing), ``apply_router_weight_on_input``, fp8 block shapes
other than 128x128, and one activation scale per tensor with per-channel weight scales.

Every layer here has an M that is not a multiple of 16, a hidden size (GEMM1's K) that is not a multiple of the
tile or scale block, and weights that are views of wider tensors (a padded row stride). On the CPU the kernels
run on the Triton interpreter in fp16 (its bf16 dot is wrong; fp8 dots are right, so the fp8 cases run with bf16
activations as the fp8 dtypes have them); on a GPU the same tests add bf16, and the last test runs a larger
expert-parallel layer.
"""

from __future__ import annotations

import pytest
import torch
from helpers import garbage_from_empty

import moebench
from moebench._interpret import interpreting
from moebench.dtypes import DTYPES
from moebench.errors import UserError
from moebench.kernels import fused_moe as fm
from moebench.paths.torch_ref import moe_reference
from moebench.problem import Weights
from moebench.quant import FP8, quantize_weight
from moebench.tables import lookup
from moebench.tile import TileConfig

GPU = torch.cuda.is_available() and not interpreting()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PLAIN = [torch.float16] + ([torch.bfloat16] if GPU else [])  # unquantized activation dtypes checked here
TOL = {torch.float16: DTYPES["fp16"].rtol, torch.bfloat16: DTYPES["bf16"].rtol, torch.float32: DTYPES["fp32"].rtol}
FP8_TOL = DTYPES["fp8-block128"].rtol
M, H, I = 13, 200, 96  # M off 16; H off every tile and scale block (200 = 128 + 72 = 3 * 64 + 8); I off 64
PAD = 24  # extra elements per weight row: the weights are views with a row stride of K + PAD

# Eight global experts, four on this rank: global 1, 3, 4, 6 are local 0..3.
GLOBAL = 8
EXPERT_MAP = torch.tensor([-1, 0, -1, 1, 2, -1, 3, -1], dtype=torch.int32)
REMOTE = [0, 2, 5, 7]


@pytest.fixture(autouse=True)
def no_tables(monkeypatch, tmp_path):
    """No table but the heuristic: MOEBENCH_CONFIGS unset, the shipped folder empty."""
    monkeypatch.delenv(lookup.ENV_VAR, raising=False)
    monkeypatch.setattr(lookup, "SHIPPED_DIR", tmp_path / "shipped")


def padded(w: torch.Tensor) -> torch.Tensor:
    """``w`` [E, N, K] as a view of an [E, N, K + PAD] tensor: rows PAD elements apart, last dim contiguous."""
    wide = torch.zeros(*w.shape[:2], w.shape[2] + PAD, dtype=w.dtype, device=w.device)
    wide[..., : w.shape[2]] = w
    view = wide[..., : w.shape[2]]
    assert view.stride(1) == w.shape[2] + PAD and not view.is_contiguous()
    return view


def layer(experts: int, topk: int, act: torch.dtype, seed: int, fp8: str | None = None,
          block: tuple[int, int] = (128, 128)):
    """x [M, H] in ``act``; w13 [experts, 2I, H], w2 [experts, H, I] padded views (fp8 with ``fp8``'s scales,
    else in ``act``); routing over GLOBAL experts [M, topk], int64 ids, top-k weights of a softmax."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, H, generator=gen).to(DEVICE, act)
    w13 = torch.randn(experts, 2 * I, H, generator=gen) / H**0.5
    w2 = torch.randn(experts, H, I, generator=gen) / I**0.5
    topk_weights, topk_ids = torch.rand(M, GLOBAL, generator=gen).softmax(-1).topk(topk)
    if fp8 is None:
        weights = Weights(padded(w13.to(DEVICE, act)), padded(w2.to(DEVICE, act)), None, None, None)
    else:
        (q13, s13), (q2, s2) = (quantize_weight(w.to(DEVICE), fp8, block) for w in (w13, w2))
        weights = Weights(padded(q13), padded(q2), s13, s2, fp8, block_shape=block)
    return x, weights, topk_weights.to(DEVICE), topk_ids.to(DEVICE)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref))


def scales(w: Weights) -> dict:
    return dict(w13_scale=w.w13_scale, w2_scale=w.w2_scale)


# ---- expert_map ----

def ep_routing(topk_ids: torch.Tensor) -> torch.Tensor:
    """The ids with token 0 routed to remote experts only, and token 1 to local ones only."""
    ids = topk_ids.clone()
    ids[0] = torch.tensor(REMOTE[: ids.shape[1]])
    ids[1] = torch.tensor([1, 3, 4, 6][: ids.shape[1]])
    return ids


EP_CONFIGS = [
    TileConfig(16, 32, 64),  # the align step: remote slots are left out of every tile
    TileConfig(16, 32, 64, direct_route=True, atomic_sum=False),  # a tile per slot, remote ones skipped; rows summed
    TileConfig(16, 64, 32, swap_ab=True, split_k=2, atomic_sum=False),  # split-K, stored rows: unwritten rows zero
]


@pytest.mark.parametrize("act", PLAIN)
@pytest.mark.parametrize("config", EP_CONFIGS)
def test_expert_map_remote_slots_add_nothing(config, act, monkeypatch):
    """Global ids through expert_map on 4 local of 8 experts: the output matches the reference over the local
    experts, and a token routed only to remote experts gets zeros (every buffer starts as NaN garbage)."""
    x, w, topk_weights, topk_ids = layer(4, 2, act, seed=1)
    ids = ep_routing(topk_ids)
    emap = EXPERT_MAP.to(DEVICE)
    remote = emap.long()[ids] < 0
    assert remote.any() and not remote.all() and remote[0].all()  # the case: remote slots, one token wholly remote
    garbage_from_empty(monkeypatch)
    out = moebench.fused_moe(x, w.w13, w.w2, topk_weights, ids, expert_map=emap, config=config)
    ref = moe_reference(x, w, topk_weights, ids, expert_map=emap)
    assert torch.count_nonzero(out[0]) == 0
    assert rel_err(out, ref) < TOL[act]


@pytest.mark.parametrize("fp8, block, config", [
    ("tensor", (128, 128), TileConfig(16, 64, 32, split_k=2)),  # h's per-tensor scale over split-K rows: zeroed
    ("channel", (128, 128), TileConfig(16, 32, 64, direct_route=True)),  # per-token scales, a tile per slot
    ("block", (64, 64), TileConfig(16, 64, 64)),  # 64x64 blocks; GEMM1 writes h in fp8 (BLOCK_N = block_k)
])
def test_expert_map_with_fp8_scales(fp8, block, config, monkeypatch):
    """expert_map with each fp8 scale scheme: scales are read for local experts, and the rows no tile writes do
    not reach a per-tensor scale."""
    kernel_scheme = "block128" if fp8 == "block" else fp8
    x, w, topk_weights, topk_ids = layer(4, 2, torch.bfloat16, seed=2, fp8=kernel_scheme, block=block)
    ids, emap = ep_routing(topk_ids), EXPERT_MAP.to(DEVICE)
    garbage_from_empty(monkeypatch, 0x4F)  # large finite garbage: NaN would be skipped by a maximum
    extra = dict(block_shape=list(block)) if fp8 == "block" else {}
    out = moebench.fused_moe(x, w.w13, w.w2, topk_weights, ids, fp8_scheme=fp8, **scales(w), expert_map=emap,
                             config=config, **extra)
    assert torch.count_nonzero(out[0]) == 0
    assert rel_err(out, moe_reference(x, w, topk_weights, ids, expert_map=emap)) < FP8_TOL


def test_the_reference_with_an_expert_map_is_the_local_layer_with_remote_weights_zero():
    """moe_reference's expert_map: the same as mapping the ids by hand and giving remote slots weight 0."""
    x, w, topk_weights, topk_ids = layer(4, 2, torch.float32, seed=3)
    ids, emap = ep_routing(topk_ids), EXPERT_MAP
    local = emap.long()[ids.cpu()].to(DEVICE)
    by_hand = moe_reference(x, w, topk_weights * (local >= 0), local.clamp_min(0))
    assert torch.allclose(moe_reference(x, w, topk_weights, ids, expert_map=emap.to(DEVICE)), by_hand, atol=1e-5)


# ---- apply_router_weight_on_input ----

@pytest.mark.parametrize("act", PLAIN)
def test_router_weight_on_input_scales_x_not_the_output(act):
    """Top-k 1 with apply_router_weight_on_input: silu is not linear, so weighting x differs from weighting the
    output (the two references differ); the layer matches the one that weights x, with and without expert_map."""
    x, w, topk_weights, topk_ids = layer(8, 1, act, seed=4)
    topk_weights = topk_weights * 3.0  # far from 1, so where the weight goes shows
    ref = moe_reference(x, w, topk_weights, topk_ids, apply_router_weight_on_input=True)
    assert rel_err(moe_reference(x, w, topk_weights, topk_ids), ref) > 10 * TOL[act]
    out = moebench.fused_moe(x, w.w13, w.w2, topk_weights, topk_ids, apply_router_weight_on_input=True)
    assert rel_err(out, ref) < TOL[act]
    x4, w4, _, _ = layer(4, 1, act, seed=4)
    emap = EXPERT_MAP.to(DEVICE)
    out = moebench.fused_moe(x4, w4.w13, w4.w2, topk_weights, topk_ids, apply_router_weight_on_input=True,
                             expert_map=emap)
    ref = moe_reference(x4, w4, topk_weights, topk_ids, expert_map=emap, apply_router_weight_on_input=True)
    assert rel_err(out, ref) < TOL[act]


def test_router_weight_on_input_with_fp8_quantizes_the_weighted_x():
    """fp8 per-tensor scales: x is weighted before its quantization, as vLLM's prepare step does."""
    x, w, topk_weights, topk_ids = layer(8, 1, torch.bfloat16, seed=5, fp8="tensor")
    out = moebench.fused_moe(x, w.w13, w.w2, topk_weights * 3.0, topk_ids, fp8_scheme="tensor", **scales(w),
                             apply_router_weight_on_input=True)
    ref = moe_reference(x, w, topk_weights * 3.0, topk_ids, apply_router_weight_on_input=True)
    assert rel_err(out, ref) < FP8_TOL


# ---- fp8 block shapes ----

BLOCK_CASES = [
    ((64, 64), None),  # the heuristic, its K step set to block_k
    ((64, 128), None),
    ((128, 64), None),
    ((128, 128), None),  # the default block through fp8_scheme="block"
    ((64, 64), TileConfig(16, 64, 64, swap_ab=True)),  # Swap-AB; GEMM1 writes h's 1x64 groups (BLOCK_N = 64)
    ((64, 64), TileConfig(16, 32, 64, split_k=2, gemm1_merged=True)),  # merged GEMM1; _swiglu writes 1x64 groups
    ((64, 128), TileConfig(16, 128, 128, direct_route=True, gemm1_quant_x=True)),  # GEMM1 quantizes x, 1x128
    ((64, 128), TileConfig(16, 32, 128, atomic_sum=False, gemm2_block_n=128)),  # GEMM2 tiles wider than block_n
]


@pytest.mark.parametrize("block, config", BLOCK_CASES)
def test_fp8_block_shapes_match_the_reference(block, config, monkeypatch):
    """Weight scales per [block_n, block_k] block and 1 x block_k activation groups, with K (hidden, and I = 96
    at 64-wide blocks) off the block."""
    x, w, topk_weights, topk_ids = layer(8, 2, torch.bfloat16, seed=6, fp8="block128", block=block)
    assert w.w13_scale.shape == (8, -(-2 * I // block[0]), -(-H // block[1]))
    groups = []
    real = fm.quantize_act
    monkeypatch.setattr(fm, "quantize_act", lambda t, scheme, *a, **kw: groups.append(kw.get("group"))
                        or real(t, scheme, *a, **kw))
    out = moebench.fused_moe(x, w.w13, w.w2, topk_weights, topk_ids, fp8_scheme="block", block_shape=list(block),
                             **scales(w), config=config)
    assert set(groups) <= {block[1]}  # every activation quantization launch made block_k groups
    assert rel_err(out, moe_reference(x, w, topk_weights, topk_ids)) < FP8_TOL


@pytest.mark.parametrize("block, kwargs, message", [
    ((64, 64), dict(fp8_scheme="block", block_shape=[64, 64], config=TileConfig(16, 64, 128)),
     "blocks of \\[64, 64\\] needs BLOCK_SIZE_K=64"),
    ((128, 128), dict(fp8_scheme="block", block_shape=[32, 128]), "each one of 64, 128"),
    ((128, 128), dict(fp8_scheme="block128", block_shape=[64, 64]), "use fp8_scheme='block'"),
    ((128, 128), dict(fp8_scheme="channel", block_shape=[64, 64]), "block_shape is for"),
    ((128, 128), dict(fp8_scheme="block", block_shape=[128, 64]), r"needs w13_scale \[8, 2, 4\]"),  # 128x128 scales
    ((128, 128), dict(fp8_scheme="tensor", per_act_token_quant=True), "per-token activation scales with per-tensor"),
    ((128, 128), dict(fp8_scheme="block", per_act_token_quant=False), "per_act_token_quant is for"),
    ((128, 128), dict(fp8_scheme="channel", per_act_token_quant=True, act_scale=torch.ones(2)), "one per token"),
    ((128, 128), dict(fp8_scheme="block128", apply_router_weight_on_input=True), "only implemented for topk=1"),
    ((128, 128), dict(fp8_scheme="block128", expert_map=torch.zeros(2, 4, dtype=torch.int32)),
     "expert_map must be an int32"),
])
def test_unsupported_combinations_are_one_line(block, kwargs, message):
    """Each combination the kernels do not run (or that contradicts itself) is refused in one line."""
    x, w, topk_weights, topk_ids = layer(8, 2, torch.bfloat16, seed=7, fp8="block128", block=block)
    kwargs = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with pytest.raises(UserError, match=message) as e:
        moebench.fused_moe(x, w.w13, w.w2, topk_weights, topk_ids, **scales(w), **kwargs)
    assert "\n" not in str(e.value)


# ---- per-tensor activation scale, per-channel weight scales ----

@pytest.mark.parametrize("static, config", [
    (False, TileConfig(16, 32, 64)),  # dynamic: GEMM1's tile maxima give h's scale
    (False, TileConfig(16, 32, 64, split_k=2, swap_ab=True)),  # dynamic, split-K: a launch finds h's maximum
    (True, TileConfig(16, 32, 64)),  # static input scales: GEMM1 writes h in fp8 at the given scale
])
def test_per_tensor_activation_scale_with_per_channel_weights(static, config, monkeypatch):
    """fp8 "channel" weights with per_act_token_quant=False (or a static act_scale): every activation
    quantization is per tensor, and the layer matches the reference."""
    x, w, topk_weights, topk_ids = layer(8, 2, torch.bfloat16, seed=8, fp8="channel")
    schemes = []
    real = fm.quantize_act
    monkeypatch.setattr(fm, "quantize_act", lambda t, scheme, *a, **kw: schemes.append(scheme)
                        or real(t, scheme, *a, **kw))
    # static scales as a checkpoint calibrates them: x's largest value, and about h's (|h| stays under 8 here)
    extra = dict(act_scale=torch.stack([x.float().abs().amax(), torch.tensor(8.0, device=DEVICE)]) / 448) \
        if static else dict(per_act_token_quant=False)
    out = moebench.fused_moe(x, w.w13, w.w2, topk_weights, topk_ids, fp8_scheme="channel", **scales(w), **extra,
                             config=config)
    assert schemes and set(schemes) == {"tensor"}
    assert rel_err(out, moe_reference(x, w, topk_weights, topk_ids)) < FP8_TOL


# ---- on the GPU: a larger expert-parallel layer ----

@pytest.mark.skipif(not GPU, reason="a served-size layer: the GPU only")
@pytest.mark.parametrize("dtype, block", [("bf16", None), ("fp8", (128, 128)), ("fp8", (64, 128)), ("fp8", (64, 64))])
def test_expert_parallel_layer_at_a_served_size(dtype, block):
    """64 global experts, 16 on this rank (every 4th), hidden 2048 + 8, I 384, top-k 8, M 1 to 517: the heuristic's
    configs (decode and prefill tiles), bf16 and fp8 blocks, against the reference."""
    gen = torch.Generator().manual_seed(9)
    E, h, i, k = 16, 2056, 384, 8
    emap = torch.full((64,), -1, dtype=torch.int32)
    emap[::4] = torch.arange(E, dtype=torch.int32)
    w13 = torch.randn(E, 2 * i, h, generator=gen) / h**0.5
    w2 = torch.randn(E, h, i, generator=gen) / i**0.5
    if block is None:
        w = Weights(padded(w13.to(DEVICE, torch.bfloat16)), padded(w2.to(DEVICE, torch.bfloat16)), None, None, None)
        extra, tol = {}, TOL[torch.bfloat16]
    else:
        (q13, s13), (q2, s2) = (quantize_weight(t.to(DEVICE), "block128", block) for t in (w13, w2))
        w = Weights(padded(q13), padded(q2), s13, s2, "block128", block_shape=block)
        extra, tol = dict(fp8_scheme="block", block_shape=list(block), **scales(w)), FP8_TOL
        assert w.w13.dtype == FP8
    for m in (1, 7, 100, 517):
        x = torch.randn(m, h, generator=gen).to(DEVICE, torch.bfloat16)
        topk_weights, topk_ids = torch.rand(m, 64, generator=gen).softmax(-1).topk(k)
        topk_weights, topk_ids = topk_weights.to(DEVICE), topk_ids.to(DEVICE)
        out = moebench.fused_moe(x, w.w13, w.w2, topk_weights, topk_ids, expert_map=emap.to(DEVICE), **extra)
        ref = moe_reference(x, w, topk_weights, topk_ids, expert_map=emap.to(DEVICE))
        assert rel_err(out, ref) < tol, f"M={m}"
    torch.cuda.synchronize()

