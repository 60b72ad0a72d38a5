"""The fused-MoE layer on the host: routed tokens in, the layer's output out, with no host synchronization.

1. the align step groups the token slots by expert (``align.moe_align``), or a tile per slot skips it;
2. x is quantized to fp8 where the scheme needs it (``act_quant``), unless GEMM1 does it in its K loop;
3. ``gemm1._gemm1_swiglu`` writes ``h = silu(x @ gate.T) * (x @ up.T)`` ``[T, I]``;
4. ``gemm2._gemm2_combine`` multiplies h by w2 and adds each slot's row, times its routed weight, into
   its token's row of the output ``[M, hidden]``.
The GEMMs are two launches because GEMM2 needs h's whole ``I``-long row, which GEMM1 spreads over
``cdiv(I, BLOCK_N)`` programs. Token counts are ``do_not_specialize`` and the grids are sized from shapes
(an upper bound on row tiles), so a changing M reuses the compiled kernels and needs no host sync.
``launch_plan`` decides every flag and size of these launches from the tile config, the fp8 scheme, the
shapes and the device alone (a pure function, tested on the CPU); ``fused_moe`` allocates and launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from moebench._interpret import interpreting
from moebench.errors import UserError
from moebench.kernels import pdl as dependent
from moebench.kernels.act_quant import quantize_act
from moebench.kernels.align import max_padded_len, moe_align
from moebench.kernels.gemm1 import _gemm1_swiglu, _swiglu
from moebench.kernels.gemm2 import TOPK_SUM_BLOCK, _gemm2_combine, _topk_sum
from moebench.kernels.tiles import QUANT_BLOCK, QUANT_NONE, QUANT_OF_SCHEME
from moebench.tile import TileConfig, tma_rows

# The largest top-k sums (bytes) GEMM1's programs zero, each a share, so no launch does; larger ones are
# zeroed by x's quantization launch at fp8-block128 (each program the sums' tile at its tile of x), else
# by a launch of their own: beyond this size the zeroing no longer hides in GEMM1.
ZERO_IN_GEMM1_BYTES = 1 << 20


@dataclass(frozen=True)
class LayerShapes:
    """What the launch plan needs to know of the layer's tensors."""

    M: int  # tokens
    experts: int  # E
    hidden: int
    intermediate: int  # I
    topk: int
    static_scales: bool = False  # static per-tensor activation scales given (act_scale)
    out_dtype: torch.dtype = torch.bfloat16  # the output's dtype: atomic_out adds into it
    out_contiguous: bool = True  # the output's rows packed, so GEMM1 can zero it as one block (atomic_out)
    weight_bytes: int = 2  # bytes per element of w13 (TMA needs rows of a multiple of 16 bytes)
    act_per_tensor: bool = False  # fp8 "channel" weights with one activation scale per tensor, not per token
    block_shape: tuple[int, int] = (128, 128)  # fp8 "block128": (block_n, block_k) of the weight scales
    remote_slots: bool = False  # slots may route to no local expert (expert_map): no tile computes them

    @property
    def slots(self) -> int:
        """T = M * topk."""
        return self.M * self.topk

    @classmethod
    def of(cls, x: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor, out: torch.Tensor | None = None,
           act_scale: torch.Tensor | None = None, **scales) -> LayerShapes:
        """The shapes of these tensors; ``scales``: act_per_tensor, block_shape, remote_slots as given."""
        M, H = x.shape
        E, two_i, _ = w13.shape
        return cls(M, E, H, two_i // 2, topk_ids.shape[1], static_scales=act_scale is not None,
                   out_dtype=x.dtype if out is None else out.dtype,
                   out_contiguous=out is None or out.is_contiguous(), weight_bytes=w13.element_size(), **scales)


@dataclass(frozen=True)
class DeviceFacts:
    """What the launch plan needs to know of the device."""

    pdl: bool  # launches can be programmatic dependents (sm90 and later, not the interpreter)
    interpreting: bool  # the Triton interpreter runs the kernels (no bf16 atomics, fp8 casts rounded first)

    @classmethod
    def of(cls, device: torch.device) -> DeviceFacts:
        return cls(dependent.has_pdl(device), interpreting())


@dataclass(frozen=True)
class LaunchPlan:
    """Every flag and size of the layer's launches, in launch order."""

    quant: int  # the kernels' QUANT (tiles.QUANT_*)
    per_tensor: bool  # one activation scale per tensor: its strides are 0
    act_scheme: str | None  # the activations' quantization (act_quant's scheme): "tensor", "channel", "block128"
    scale_n: int  # fp8 block scales: weight rows per scale block (the kernels' SCALE_N)
    scale_k: int  # fp8 block scales: columns per block and per activation group (BLOCK_SIZE_K)
    static: bool  # static activation scales: x and h quantized at the given scales
    pdl: bool  # every launch a programmatic dependent (a tile per slot, where the device has it, no expert_map)
    round_first: bool  # fp8 casts rounded in float32 first (the interpreter's cast drops carries)
    slots: int  # T = M * topk
    align: bool  # an align launch groups the slots by expert (else a tile per slot: direct_route)
    max_blocks: int  # the grids' bound on row tiles: T with a tile per slot, else the align's bound
    sums: str  # GEMM2's top-k sums: "out" (atomics into the output), "float32" (atomics, then a cast), "rows"
    zero: str  # who zeroes the atomic sums: "gemm1", "x_quant" (x's quantization launch), "launch", "none"
    x_quant: bool  # GEMM1 quantizes x's 1x128 groups in its K loop (gemm1_quant_x)
    quantize_x: bool  # a launch quantizes x
    split: int  # GEMM1 split-K: programs per tile, partial sums added by the _swiglu launch
    group_out: bool  # GEMM1's epilogue writes h in fp8 with a scale per 1x128 group (one group per tile row)
    quant_out: bool  # h written in fp8 with group scales, by GEMM1's epilogue or the _swiglu launch
    static_out: bool  # GEMM1's epilogue writes h in fp8 at the static scale
    amax_out: bool  # each GEMM1 program writes the maximum of its tile of h, for h's per-tensor scale
    h_fp8: bool  # h [T, I] is stored in fp8 (w2's dtype), else in x's dtype
    quantize_h: bool  # a launch quantizes h
    grid1: int  # GEMM1's programs
    even_k1: bool  # hidden % BLOCK_K == 0: GEMM1's loads carry no K mask
    even_n1: bool  # I % BLOCK_N == 0: GEMM1's weight loads carry no column mask
    swiglu: bool  # the _swiglu launch runs (split-K, some slots)
    swiglu_block_n: int
    swiglu_block_g: int
    zero_partials: bool  # split-K partial sums zeroed: h's per-tensor scale reads rows no tile writes
    split2: int  # GEMM2 split-K: programs per tile, each adding its partial sum atomically
    block_n2: int  # GEMM2's BLOCK_N
    grid2: int  # GEMM2's programs
    even_k2: bool  # I % BLOCK_K == 0
    even_n2: bool  # hidden % (block_n2 * gemm2_n_tiles) == 0: every program's column tiles lie within hidden
    cast_out: bool  # the float32 sums are copied into the output
    topk_sum: bool  # the _topk_sum launch adds the stored rows (stored rows, some tokens)
    topk_sum_block: int  # its columns per program
    topk_sum_cols: int  # its programs per token
    zero_rows: bool  # the stored rows zeroed: slots of remote experts (expert_map) get no tile to write theirs


def _scheme_name(fp8_scheme: str | None, static: bool, block_shape: tuple[int, int] = (128, 128)) -> str:
    if fp8_scheme == "block128" and block_shape != (128, 128):
        return f"fp8 blocks of {list(block_shape)}"
    return "an unquantized layer" if fp8_scheme is None else f"fp8-{fp8_scheme}" + ("-static" if static else "")


def launch_plan(config: TileConfig, fp8_scheme: str | None, shapes: LayerShapes, device: DeviceFacts) -> LaunchPlan:
    """The layer's launches for ``config`` at ``fp8_scheme`` (None, "tensor", "channel", "block128": block scales
    of ``shapes.block_shape``), decided from shapes alone (nothing read from the device), so the layer needs no
    host synchronization.

    Raises UserError for a config the scheme or the shapes cannot run; asserts what only a caller's bug gives.
    """
    assert fp8_scheme in QUANT_OF_SCHEME, f"unknown fp8 scheme {fp8_scheme!r}"
    quant = QUANT_OF_SCHEME[fp8_scheme]
    static = shapes.static_scales
    assert not shapes.act_per_tensor or fp8_scheme == "channel", "act_per_tensor is for channel weight scales"
    per_tensor = fp8_scheme == "tensor" or shapes.act_per_tensor
    assert not static or per_tensor, "static activation scales are per tensor"
    scale_n, scale_k = shapes.block_shape
    assert all(b >= 16 and b & (b - 1) == 0 for b in shapes.block_shape), "block sides are powers of two >= 16"
    name = _scheme_name(fp8_scheme, static, shapes.block_shape)
    if quant == QUANT_BLOCK and config.BLOCK_SIZE_K != scale_k:
        raise UserError(f"tile config: {name if scale_k != 128 else 'fp8-block128'} needs BLOCK_SIZE_K={scale_k} "
                        f"(one scale block per step), not {config.BLOCK_SIZE_K}")
    if config.gemm1_quant_x and quant != QUANT_BLOCK:
        raise UserError(f"tile config: gemm1_quant_x is for fp8-block128, not {name}")
    H, I = shapes.hidden, shapes.intermediate
    if config.gemm1_tma and not tma_rows(H, shapes.weight_bytes):
        raise UserError(f"gemm1_tma: rows of {H} x {shapes.weight_bytes} bytes are not a multiple of 16 (TMA)")
    if config.atomic_out:
        assert not (device.interpreting and shapes.out_dtype == torch.bfloat16), \
            "the Triton interpreter has no bf16 atomics"

    T = shapes.slots
    bm = config.BLOCK_SIZE_M
    max_blocks = T if config.direct_route else max_padded_len(T, shapes.experts, bm) // bm

    # GEMM2's top-k sums [M, hidden], which its atomics add into: float32, then cast to the output; with
    # atomic_out the output itself. GEMM1 zeroes them where they are one contiguous block of at most
    # ZERO_IN_GEMM1_BYTES; else x's 1x128-group quantization launch, where there is one; else a launch.
    x_quant = config.gemm1_quant_x
    if config.atomic_sum:
        sums = "out" if config.atomic_out else "float32"
        elem = shapes.out_dtype.itemsize if config.atomic_out else 4
        contiguous = shapes.out_contiguous or not config.atomic_out
        if contiguous and shapes.M * H * elem <= ZERO_IN_GEMM1_BYTES:
            zero = "gemm1"
        elif quant == QUANT_BLOCK and not x_quant:
            zero = "x_quant"
        else:
            zero = "launch"
    else:
        sums, zero = "rows", "none"

    # h in fp8: with block scales after a split-K GEMM1 the _swiglu launch writes it with its group scales;
    # without split-K GEMM1's epilogue does where its tiles are one group wide (block_k: a tile row is a group).
    # Static scales without split-K: GEMM1's epilogue writes it at the given scale.
    split = config.split_k
    group_out = quant == QUANT_BLOCK and split == 1 and config.BLOCK_SIZE_N == scale_k
    quant_out = (quant == QUANT_BLOCK and split > 1) or group_out
    static_out = static and split == 1
    grid1 = max_blocks * triton.cdiv(I, config.BLOCK_SIZE_N) * split
    block_n2, n_tiles = config.block_n2, config.gemm2_n_tiles
    block = min(TOPK_SUM_BLOCK, triton.next_power_of_2(H))
    return LaunchPlan(
        quant=quant, per_tensor=per_tensor, static=static, scale_n=scale_n, scale_k=scale_k,
        act_scheme="tensor" if per_tensor else fp8_scheme,
        # A dependent launch reads topk_ids before it waits, as an input of the layer; mapped through expert_map
        # they are a launch's output, so then no launch is a dependent.
        pdl=config.direct_route and device.pdl and not shapes.remote_slots,
        round_first=device.interpreting, slots=T, align=not config.direct_route, max_blocks=max_blocks,
        sums=sums, zero=zero, x_quant=x_quant, quantize_x=quant != QUANT_NONE and not x_quant,
        split=split, group_out=group_out, quant_out=quant_out, static_out=static_out,
        # A dynamic per-tensor scale of h from the maxima of GEMM1's tiles, so no launch reads h for it (with
        # split-K the _swiglu launch writes h, and h's quantization finds its maximum itself).
        amax_out=per_tensor and not static and split == 1,
        h_fp8=quant_out or static_out, quantize_h=quant != QUANT_NONE and not quant_out and not static_out,
        grid1=grid1, even_k1=H % config.BLOCK_SIZE_K == 0, even_n1=I % config.BLOCK_SIZE_N == 0,
        swiglu=split > 1 and T > 0, swiglu_block_n=min(1024, triton.next_power_of_2(I)),
        swiglu_block_g=min(8, triton.next_power_of_2(triton.cdiv(I, scale_k))),
        # Rows of h no tile writes (remote slots) are zero where h's per-tensor scale is read from all of h.
        zero_partials=shapes.remote_slots and split > 1 and per_tensor and not static,
        split2=config.gemm2_split_k, block_n2=block_n2,
        grid2=max_blocks * triton.cdiv(H, block_n2 * n_tiles) * config.gemm2_split_k,
        even_k2=I % config.BLOCK_SIZE_K == 0, even_n2=H % (block_n2 * n_tiles) == 0,
        cast_out=sums == "float32", topk_sum=sums == "rows" and shapes.M > 0, topk_sum_block=block,
        topk_sum_cols=triton.cdiv(H, block), zero_rows=sums == "rows" and shapes.remote_slots,
    )


def _weight_descriptor(w13: torch.Tensor, cfg: TileConfig) -> TensorDescriptor:
    """A TMA descriptor of w13 [E, 2I, hidden] as [E * 2I, hidden], blocks [BLOCK_N, BLOCK_K] (gemm1_tma)."""
    E, two_i, H = w13.shape
    return TensorDescriptor.from_tensor(w13.view(E * two_i, H), [cfg.BLOCK_SIZE_N, cfg.BLOCK_SIZE_K])


def _launch_args(cfg: TileConfig) -> dict:
    return dict(
        BLOCK_M=cfg.BLOCK_SIZE_M,
        BLOCK_N=cfg.BLOCK_SIZE_N,
        BLOCK_K=cfg.BLOCK_SIZE_K,
        GROUP_M=cfg.GROUP_SIZE_M,
        SWAP_AB=cfg.swap_ab,
        DIRECT=cfg.direct_route,
        TAIL=cfg.tail_tiles,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def _scale_strides(scale: torch.Tensor | None, ndim: int, one_value: bool = False) -> tuple[int, ...]:
    """Strides of a scale tensor as the kernels index it ([rows(, k-groups)] or [E(, n-blocks, k-blocks)]).

    Missing trailing dims get stride 0: a per-expert scale [E] serves every column. ``one_value``
    (a per-tensor activation scale [1]) gives stride 0 everywhere: every row reads element 0.
    """
    if scale is None or one_value:
        return (0,) * ndim
    return tuple(scale.stride()) + (0,) * (ndim - scale.dim())


def fused_moe(
    x: torch.Tensor,  # [M, hidden] bf16/fp16/fp32
    w13: torch.Tensor,  # [E, 2I, hidden]
    w2: torch.Tensor,  # [E, hidden, I]
    topk_weights: torch.Tensor,  # [M, topk] float32
    topk_ids: torch.Tensor,  # [M, topk] int32
    config: TileConfig,
    out: torch.Tensor | None = None,  # [M, hidden], x's dtype
    fp8_scheme: str | None = None,  # None, "tensor", "channel", "block128"
    w13_scale: torch.Tensor | None = None,  # moebench.quant's weight-scale layouts
    w2_scale: torch.Tensor | None = None,
    act_scale: torch.Tensor | None = None,  # [2] float32 static input scales of GEMM1 and GEMM2 (per tensor)
    compiled: list | None = None,  # if given, the two GEMMs' compiled kernels are appended (ISA inspection)
    *,
    act_per_tensor: bool = False,  # "channel" weight scales with one activation scale per tensor
    block_shape: tuple[int, int] = (128, 128),  # "block128": (block_n, block_k) of the weight scales
    expert_map: torch.Tensor | None = None,  # [global E] int32: a global id's local expert, -1 on another rank
    apply_router_weight_on_input: bool = False,  # top-k 1: x times its routed weight before GEMM1
) -> torch.Tensor:
    """The whole MoE layer from routed tokens to the output, with no host synchronization.

    With ``expert_map`` the ids are global: each maps to its local expert, and a slot of an expert of another
    rank (-1) gets no tile and adds nothing. With ``apply_router_weight_on_input`` x is multiplied by the
    routed weight (in x's dtype, before any quantization) and GEMM2's rows by 1."""
    assert x.stride(1) == 1 and w13.stride(2) == 1 and w2.stride(2) == 1, "last dims must be contiguous"
    assert topk_weights.is_contiguous() and topk_weights.dtype == torch.float32
    if expert_map is not None:
        assert expert_map.dtype == torch.int32 and topk_ids.dtype == torch.int32
        topk_ids = expert_map.index_select(0, topk_ids.reshape(-1)).view(topk_ids.shape)  # [M, topk] local or -1
    if apply_router_weight_on_input:
        assert topk_ids.shape[1] == 1, "the routed weight multiplies x only at top-k 1"
        x = x * topk_weights.to(x.dtype)  # [M, hidden]
        topk_weights = torch.ones_like(topk_weights)
    shapes = LayerShapes.of(x, w13, topk_ids, out, act_scale, act_per_tensor=act_per_tensor,
                            block_shape=tuple(block_shape), remote_slots=expert_map is not None)
    plan = launch_plan(config, fp8_scheme, shapes, DeviceFacts.of(x.device))
    M, H = x.shape
    I = w13.shape[1] // 2
    T = plan.slots
    static = plan.static
    dep = dependent.launch_kwargs(plan.pdl)
    launch = dict(QUANT=plan.quant, TOPK=topk_ids.shape[1], **_launch_args(config), **dep)

    if plan.align:
        align = moe_align(topk_ids, w13.shape[0], config.BLOCK_SIZE_M)
        sorted_ids, expert_ids, num_padded = align.sorted_ids, align.expert_ids, align.num_padded
    else:  # a tile per slot: topk_ids serves as the tiles' expert ids
        ids = topk_ids.reshape(-1)  # [T]
        sorted_ids, expert_ids, num_padded = ids, ids, ids

    act_dtype = x.dtype
    if out is None:
        out = torch.empty(M, H, device=x.device, dtype=act_dtype)
    if plan.sums == "out":
        assert out.stride(1) == 1, "atomic_out adds into the output: its rows must be contiguous"
        acc = out  # [M, H]
    elif plan.sums == "float32":
        acc = torch.empty(M, H, device=x.device, dtype=torch.float32)  # [M, H]
    else:
        acc = None
    zero = plan.zero == "gemm1"
    a1, a1_scale = quantize_act(x, plan.act_scheme, act_scale[:1] if static else None, pdl=plan.pdl,
                                zero=acc if plan.zero == "x_quant" else None,
                                group=plan.scale_k) if plan.quantize_x else (x, None)
    if plan.zero == "launch":
        acc.zero_()

    h = torch.empty(T, I, device=x.device, dtype=w2.dtype if plan.h_fp8 else act_dtype)  # [T, I]
    h_scale = torch.empty(T, triton.cdiv(I, plan.scale_k), device=x.device, dtype=torch.float32) \
        if plan.quant_out else None  # [T, groups]
    split = plan.split
    # Split-K: each split's gate|up partial sums, every entry of a local slot written by GEMM1 (so not zeroed).
    partials = torch.zeros if plan.zero_partials else torch.empty
    gu = h if split == 1 else partials(split, T, 2 * I, device=x.device, dtype=torch.float32)  # [split, T, 2I]
    stride_split = T * 2 * I
    maxima = torch.empty(plan.grid1, device=x.device, dtype=torch.float32) if plan.amax_out else None  # [grid1]
    k1 = _gemm1_swiglu[(plan.grid1,)](
        a1, w13, gu, act_scale[1:] if static else h_scale, a1_scale, w13_scale, sorted_ids, expert_ids, num_padded,
        T, plan.max_blocks, I, H, a1.stride(0), w13.stride(0), w13.stride(1), gu.stride(-2), stride_split,
        h_scale.stride(0) if plan.group_out else 0, *_scale_strides(a1_scale, 2, plan.per_tensor),
        *_scale_strides(w13_scale, 3), SPLIT_K=split, MERGED=config.gemm1_merged, STATIC_OUT=plan.static_out,
        GROUP_OUT=plan.group_out, ROUND_FIRST=plan.round_first, X_QUANT=plan.x_quant,
        zero_ptr=acc if zero else None, zero_numel=acc.numel() if zero else 0, ZERO=zero,
        EVEN_K=plan.even_k1, EVEN_N=plan.even_n1,
        w_desc=_weight_descriptor(w13, config) if config.gemm1_tma else None, TMA_W=config.gemm1_tma,
        amax_ptr=maxima, AMAX_OUT=plan.amax_out, SCALE_N=plan.scale_n, **launch,
    )
    if plan.swiglu:
        _swiglu[(T,)](gu, h, h_scale, I, 0 if h_scale is None else h_scale.stride(0), stride_split, SPLIT_K=split,
                      BLOCK_N=plan.swiglu_block_n, QUANT_OUT=plan.quant_out, BLOCK_G=plan.swiglu_block_g,
                      ROUND_FIRST=plan.round_first, GROUP=plan.scale_k, **dep)

    if plan.quant_out:
        a2, a2_scale = h, h_scale  # [T, I] fp8, [T, cdiv(I, block_k)]
    elif plan.static_out:
        a2, a2_scale = h, act_scale[1:]  # [T, I] fp8, [1]
    elif plan.quantize_h:
        a2, a2_scale = quantize_act(h, plan.act_scheme, act_scale[1:] if static else None, pdl=plan.pdl,
                                    maxima=maxima, group=plan.scale_k)  # [T, I] fp8
    else:
        a2, a2_scale = h, None
    if plan.sums == "rows":
        acc = (torch.zeros if plan.zero_rows else torch.empty)(T, H, device=x.device, dtype=act_dtype)  # [T, H]
    k2 = _gemm2_combine[(plan.grid2,)](
        a2, w2, acc, a2_scale, w2_scale, topk_weights, sorted_ids, expert_ids, num_padded,
        T, plan.max_blocks, H, I, a2.stride(0), w2.stride(0), w2.stride(1), acc.stride(0),
        *_scale_strides(a2_scale, 2, plan.per_tensor), *_scale_strides(w2_scale, 3),
        ATOMIC_SUM=config.atomic_sum, N_TILES=config.gemm2_n_tiles, SPLIT_K=plan.split2, EVEN_K=plan.even_k2,
        EVEN_N=plan.even_n2, COLUMNS_FIRST=config.gemm2_columns_first,
        PRELOAD=config.gemm2_preload, SCALE_N=plan.scale_n, **{**launch, "BLOCK_N": plan.block_n2},
    )
    if plan.cast_out:
        out.copy_(acc)
    elif plan.topk_sum:
        _topk_sum[(M, plan.topk_sum_cols)](acc, out, H, acc.stride(0), out.stride(0), TOPK=topk_ids.shape[1],
                                           BLOCK_N=plan.topk_sum_block, **dep)
    if compiled is not None:
        compiled.extend((k1, k2))
    return out
