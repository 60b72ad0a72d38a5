"""The MoE layer in the engines' kernel form: one grouped-GEMM Triton kernel run twice, as vLLM and SGLang do.

1. the align step groups the token slots by expert (``align.moe_align``); x is quantized where the scheme says;
2. ``_grouped_gemm`` writes all 2I gate-and-up columns, ``cache1 [T, 2I] = x[slot // topk] @ w13[e].T``;
3. ``_silu_and_mul`` writes ``cache2 [T, I] = silu(gate) * up`` (quantized after it for fp8);
4. ``_grouped_gemm`` again, its A rows the slots themselves (top_k = 1) and each row times its routed weight:
   ``cache3 [T, hidden]``; the top-k rows of each token are summed into the output by torch.
One tile config drives both GEMMs, so its ``BLOCK_SIZE_N`` tiles 2I columns in GEMM1 and hidden in GEMM2, as an
engine's config file means it; a second (``down_config``, SGLang's ``_down`` table) may drive GEMM2, at GEMM1's
``BLOCK_SIZE_M`` since both read one align. Token counts are ``do_not_specialize`` and the grids are sized from
shapes (an upper bound on row tiles; programs past the align's used length return at once): no host sync, no
recompile when M changes. N, K and the strides are runtime ints, so one compiled kernel serves many shapes of a dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moebench.errors import UserError
from moebench.kernels.act_quant import quantize_act
from moebench.kernels.align import max_padded_len, moe_align
from moebench.tile import DEFAULTS, FIELDS, TileConfig

# The kernel's QUANT: no fp8; one activation scale and one weight scale per expert, applied after the K loop;
# a scale per A row and per output column, after the loop; 1x128 activation groups and 128x128 weight blocks,
# applied at every K step.
QUANT_NONE, QUANT_TENSOR, QUANT_CHANNEL, QUANT_BLOCK = 0, 1, 2, 3
QUANT_OF_SCHEME = {None: QUANT_NONE, "tensor": QUANT_TENSOR, "channel": QUANT_CHANNEL, "block128": QUANT_BLOCK}
SCALE_GROUP = 128  # block128: activation groups and weight blocks are 128 wide along K
ACT_BLOCK = 1024  # the largest column block of one _silu_and_mul program


def check_config(config: TileConfig, fp8_scheme: str | None) -> None:
    """Raise UserError where this path cannot run ``config`` at ``fp8_scheme`` (None, "tensor", "channel",
    "block128"): it reads the six engine keys only, and at block128 a K step must lie in one scale group."""
    if fp8_scheme not in QUANT_OF_SCHEME:
        raise UserError(f"triton-classic: unknown fp8 scheme {fp8_scheme!r}")
    if not config.portable:
        moved = [f.name for f in FIELDS if not f.engine and getattr(config, f.name) != DEFAULTS[f.name]
                 and not (f.default_as and getattr(config, f.name) == getattr(config, f.default_as))]
        raise UserError(f"tile config: triton-classic runs the engines' six keys only; {', '.join(moved)} "
                        "must stay at the default")
    if fp8_scheme == "block128" and SCALE_GROUP % config.BLOCK_SIZE_K:
        raise UserError(f"tile config: fp8-block128 on triton-classic needs BLOCK_SIZE_K dividing 128 (a K step "
                        f"within one scale group), not {config.BLOCK_SIZE_K}")


def default_config(M: int, experts: int, fp8_scheme: str | None) -> TileConfig:
    """The engines' untuned default, as vLLM's ``get_default_config`` gives it on CUDA (the same at vLLM commits
    000d145 and 13cb3e4, of 2025): fp8-block128 64 x 128 x 128 (the scale block's shape), GROUP_SIZE_M 32,
    4 warps, 3 stages; else, where M <= E, 16x32x64, GROUP_SIZE_M 1; else 64x64x32, GROUP_SIZE_M 8. Where vLLM
    leaves num_warps and num_stages out, Triton's launch defaults apply (4 warps, 3 stages)."""
    if fp8_scheme == "block128":
        return TileConfig(64, 128, 128, 32, 4, 3)
    if M <= experts:
        return TileConfig(16, 32, 64, 1, 4, 3)
    return TileConfig(64, 64, 32, 8, 4, 3)


@triton.jit(do_not_specialize=["num_slots", "max_pid_m"])
def _grouped_gemm(
    a_ptr,  # [rows, K]: x [M, K] (GEMM1, TOP_K = topk) or cache2 [T, K] (GEMM2, TOP_K = 1); fp8 when QUANT
    b_ptr,  # [E, N, K]
    c_ptr,  # [T, N], row = token slot
    a_scale_ptr,  # QUANT_TENSOR: [1]; QUANT_CHANNEL: [rows]; QUANT_BLOCK: [rows, cdiv(K, 128)]
    b_scale_ptr,  # QUANT_TENSOR: [E]; QUANT_CHANNEL: [E, N]; QUANT_BLOCK: [E, cdiv(N, 128), cdiv(K, 128)]
    topk_weights_ptr,  # [T] float32 (MUL_ROUTED_WEIGHT)
    sorted_ids_ptr,  # [max_pid_m * BLOCK_M] slot ids grouped by expert; == num_slots for padding
    expert_ids_ptr,  # [max_pid_m]
    num_padded_ptr,  # [1]
    num_slots,  # T = M * topk
    max_pid_m,  # the grid's bound on row tiles
    N,
    K,
    stride_am,
    stride_be,
    stride_bn,
    stride_cm,
    stride_asm,
    stride_ask,
    stride_bse,
    stride_bsn,
    stride_bsk,
    TOP_K: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    QUANT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] tile of ``c``: BLOCK_M sorted slots of one expert by BLOCK_N columns of N."""
    # GROUP_M row tiles share each column tile in the program order, so their expert's weights stay in L2.
    pid = tl.program_id(0)
    in_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(max_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return

    slot = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # [BM]
    row_ok = slot < num_slots
    row = slot // TOP_K  # A's row; padding slots point past A, and every read of them is masked
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_bn = offs_n % N  # columns past N wrap onto real rows: weight loads need no column mask; stores do
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + row[:, None] * stride_am + offs_k[None, :]  # [BM, BK]
    b_ptrs = b_ptr + expert * stride_be + offs_bn[None, :] * stride_bn + offs_k[:, None]  # [BK, BN]

    if QUANT == 1:  # QUANT_TENSOR
        a_s = tl.load(a_scale_ptr)
        b_s = tl.load(b_scale_ptr + expert * stride_bse)
    elif QUANT == 2:  # QUANT_CHANNEL
        a_s = tl.load(a_scale_ptr + row * stride_asm, mask=row_ok, other=0.0)  # [BM]
        b_s = tl.load(b_scale_ptr + expert * stride_bse + offs_bn * stride_bsn)  # [BN]
    elif QUANT == 3:  # QUANT_BLOCK
        a_s_ptrs = a_scale_ptr + row * stride_asm  # [BM], + the group's index at each step
        b_s_ptrs = b_scale_ptr + expert * stride_bse + (offs_bn // 128) * stride_bsn  # [BN]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if QUANT == 3:  # BLOCK_K divides 128: the step lies in one scale group
            group = (k * BLOCK_K) // 128
            a_s = tl.load(a_s_ptrs + group * stride_ask, mask=row_ok, other=0.0)
            b_s = tl.load(b_s_ptrs + group * stride_bsk)
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    if MUL_ROUTED_WEIGHT:
        acc = acc * tl.load(topk_weights_ptr + slot, mask=row_ok, other=0.0)[:, None]
    if QUANT == 1:
        acc = acc * (a_s * b_s)
    elif QUANT == 2:
        acc = acc * a_s[:, None] * b_s[None, :]
    c_ptrs = c_ptr + slot[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n[None, :] < N))


@triton.jit
def _silu_and_mul(gu_ptr, h_ptr, I, stride_gu, stride_h, BLOCK: tl.constexpr):
    """Grid (T, cdiv(I, BLOCK)): ``h[slot, cols] = silu(gu[slot, cols]) * gu[slot, I + cols]``, in float32."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < I
    gate = tl.load(gu_ptr + row * stride_gu + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * stride_gu + I + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(h_ptr + row * stride_h + cols, (gate * tl.sigmoid(gate) * up).to(h_ptr.dtype.element_ty), mask=ok)


def _a_scale_strides(scale: torch.Tensor | None) -> tuple[int, int]:
    """(row, group) strides of an activation scale: [rows] or [rows, groups]; a per-tensor [1] is read at 0."""
    if scale is None or scale.dim() == 0:
        return 0, 0
    return scale.stride(0), scale.stride(1) if scale.dim() == 2 else 0


def _b_scale_strides(scale: torch.Tensor | None) -> tuple[int, int, int]:
    """(expert, n-block or column, k-block) strides of a weight scale [E], [E, N] or [E, N/128, K/128]."""
    if scale is None:
        return 0, 0, 0
    return tuple(scale.stride()) + (0,) * (3 - scale.dim())


def _gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, a_scale: torch.Tensor | None,
          b_scale: torch.Tensor | None, topk_weights: torch.Tensor | None, align, num_slots: int, max_pid_m: int,
          top_k: int, quant: int, config: TileConfig) -> None:
    """c [T, N] = the grouped GEMM of a's rows by b [E, N, K] (times each slot's routed weight if given)."""
    _, N, K = b.shape
    grid = (max_pid_m * triton.cdiv(N, config.BLOCK_SIZE_N),)
    _grouped_gemm[grid](
        a, b, c, a_scale, b_scale, topk_weights, align.sorted_ids, align.expert_ids, align.num_padded,
        num_slots, max_pid_m, N, K, a.stride(0), b.stride(0), b.stride(1), c.stride(0),
        *_a_scale_strides(a_scale), *_b_scale_strides(b_scale),
        TOP_K=top_k, MUL_ROUTED_WEIGHT=topk_weights is not None, QUANT=quant,
        BLOCK_M=config.BLOCK_SIZE_M, BLOCK_N=config.BLOCK_SIZE_N, BLOCK_K=config.BLOCK_SIZE_K,
        GROUP_M=config.GROUP_SIZE_M, num_warps=config.num_warps, num_stages=config.num_stages,
    )


def classic_moe(
    x: torch.Tensor,  # [M, hidden] bf16/fp16/fp32
    w13: torch.Tensor,  # [E, 2I, hidden]: gate rows, then up rows
    w2: torch.Tensor,  # [E, hidden, I]
    topk_weights: torch.Tensor,  # [M, topk] float32
    topk_ids: torch.Tensor,  # [M, topk] int32
    config: TileConfig,
    *,
    out: torch.Tensor,  # [M, hidden]
    fp8_scheme: str | None = None,  # None, "tensor", "channel", "block128"
    w13_scale: torch.Tensor | None = None,  # moebench.quant's weight-scale layouts
    w2_scale: torch.Tensor | None = None,
    act_scale: torch.Tensor | None = None,  # [2] float32 static input scales of GEMM1 and GEMM2 ("tensor" only)
    down_config: TileConfig | None = None,  # GEMM2's, BLOCK_SIZE_M as config's; None: config
) -> torch.Tensor:
    """The whole MoE layer in the engines' kernel form, written into ``out``, with no host synchronization."""
    check_config(config, fp8_scheme)
    down = config if down_config is None else down_config
    if down is not config:
        check_config(down, fp8_scheme)
    assert down.BLOCK_SIZE_M == config.BLOCK_SIZE_M, "both GEMMs read one align: one BLOCK_SIZE_M"
    assert x.stride(1) == 1 and w13.stride(2) == 1 and w2.stride(2) == 1, "last dims must be contiguous"
    assert topk_weights.is_contiguous() and topk_weights.dtype == torch.float32
    assert act_scale is None or fp8_scheme == "tensor", "static activation scales are per tensor"
    M, H = x.shape
    E, two_i, _ = w13.shape
    I = two_i // 2
    topk = topk_ids.shape[1]
    T = M * topk
    if T == 0:
        return out
    quant = QUANT_OF_SCHEME[fp8_scheme]
    bm = config.BLOCK_SIZE_M
    align = moe_align(topk_ids, E, bm)
    max_pid_m = max_padded_len(T, E, bm) // bm

    a1, a1_scale = (x, None) if quant == QUANT_NONE else quantize_act(
        x, fp8_scheme, None if act_scale is None else act_scale[:1])
    cache1 = torch.empty(T, two_i, device=x.device, dtype=x.dtype)  # [T, 2I]
    _gemm(a1, w13, cache1, a1_scale, w13_scale, None, align, T, max_pid_m, topk, quant, config)

    cache2 = torch.empty(T, I, device=x.device, dtype=x.dtype)  # [T, I]
    block = min(ACT_BLOCK, triton.next_power_of_2(I))
    _silu_and_mul[(T, triton.cdiv(I, block))](cache1, cache2, I, cache1.stride(0), cache2.stride(0), BLOCK=block)
    a2, a2_scale = (cache2, None) if quant == QUANT_NONE else quantize_act(
        cache2, fp8_scheme, None if act_scale is None else act_scale[1:])

    cache3 = torch.empty(T, H, device=x.device, dtype=x.dtype)  # [T, H], row = slot
    _gemm(a2, w2, cache3, a2_scale, w2_scale, topk_weights, align, T, max_pid_m, 1, quant, down)

    sums = cache3.view(M, topk, H)
    if out.dtype == cache3.dtype:
        torch.sum(sums, dim=1, out=out)
    else:
        out.copy_(sums.sum(dim=1))
    return out
