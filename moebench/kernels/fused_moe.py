"""Fused-MoE grouped GEMMs in Triton: BF16/FP16/FP32 and FP8 (tensor, channel, 128x128 block).

The layer is two launches after the align step:

1. ``_gemm1_swiglu``: for a tile of token slots of one expert, ``x @ w13[e].T``
   with the gate and up halves accumulated side by side, and
   ``silu(gate) * up`` applied in the epilogue; only the ``[T, I]`` activation
   is written (the ``[T, 2I]`` GEMM output never reaches memory).
2. ``_gemm2_combine``: ``h @ w2[e].T`` for the same tiles, scaled by each slot's
   routed weight. With ``atomic_sum`` (the default) it is added into the float32
   ``[M, hidden]`` output with atomics: the top-k reduction happens in the
   epilogue, with no separate sum pass. Without, each slot's row is stored to
   ``[T, hidden]`` and one ``_topk_sum`` launch adds each token's top-k rows.
   The atomics are relaxed (only atomicity is needed; the result is read after
   the launch): with Triton's default acq_rel ordering the 235M float32 atomics
   of DeepSeek-V3@tp8 fp8 at M=4096 took 1.8 ms of GEMM2 on an H200; relaxed,
   that layer took 1472 us against 1393 us with the stored rows. With
   ``atomic_out`` the atomics add into the bf16 output itself: no float32
   buffer, no cast launch, half the bytes reduced in L2, at the cost of bf16
   roundings in the sum. The tuner tries the three forms everywhere. Where the
   sums are small (decode), GEMM1's programs zero them, each a share, so no
   launch does; larger ones at fp8-block128 x's quantization launch zeroes,
   each program the tile of the sums at its tile of x (on an H200, 0.990-1.002x
   the layer's time at the five points with such sums, in two A/Bs of
   results/h200-session31), and elsewhere a launch of their own.

Why two launches and not one: GEMM2 needs the whole ``I``-long row of the
activation, which GEMM1 spreads over ``cdiv(I, BLOCK_N)`` programs; fusing them
would need a grid-wide barrier or recomputation.

**Swap-AB** (``SWAP_AB``): the tile is computed transposed, ``C^T = W . X^T``, so
the expert's output rows (BLOCK_N of them) fill the 64-row operand of Hopper's
``wgmma`` and the few token slots (BLOCK_M) are the narrow side. Every tile
index below goes through ``_grid``, which lays a (token, column) pair out as
``[BLOCK_M, BLOCK_N]`` or, swapped, ``[BLOCK_N, BLOCK_M]``; the epilogue works
on either layout, so nothing is transposed in registers.

**FP8** (``QUANT``): 0 = none; 1 = one scale per token row of A and per output
column of B, applied once after the K loop (the per-tensor scheme passes the
same scale with stride 0; with static activation scales, GEMM1's epilogue
writes h in fp8 at the given scale, so h has no quantization launch; with
dynamic ones each GEMM1 program writes the maximum of its tile of h, so one
launch quantizes h and none reads it for its maximum: on an H200 Mixtral
fp8-tensor M=1 took 0.974x the time, the other points 0.995-1.002x, within
the spread of one kernel timed twice, results/h200-session17);
2 = 128x128 weight blocks and 1x128 activation groups, applied at every K step
(BLOCK_K must be 128): a fresh product per step, scaled and added into the
accumulator. That keeps a second accumulator-sized tile live (GEMM1 spills at
64x128 with 4 warps; the tuner gives such tiles 8). Keeping the accumulator in
the current step's scales instead (``acc *= prev / current``, then
``tl.dot(a, b, acc)``) removes the spills but was 3-16% slower than this form at
the best config of each of the 14 fp8-block128 benchmark points on an H200
(``results/h200-block128-ab``, and the tuned run of commit bab17e1), so it was dropped.

**Shapes that divide the tiles** (``EVEN_K``, ``EVEN_N``): the K loop's loads carry no K
mask, and the weight loads no mask at all; at fp8-block128 a tile's columns then lie in
one weight block, so a K step reads one weight scale, not one per column, and the
scaling is one FMA per element by a per-token vector. GEMM1's loop at fp8-block128 went
from 361 to 205 SASS instructions per K step (64x64 tile, 4 warps); Nsight Compute had
found it bound by issuing instructions (2 warps per scheduler, one issued every 4
cycles). On an H200 the layer got 1.09-1.19x faster at fp8-block128 M = 1024 and 4096
and stayed even elsewhere (``results/h200-session8``).

**A tile per slot** (``direct_route``): at decode the align step (one or two launches) is skipped;
row tile ``i`` is token slot ``i`` alone, its expert read from ``topk_ids``. Where slots sharing an
expert are few this reads no more weights. On an H200, same configs, the layer was 7-16% faster at
DeepSeek-V3@tp8 and Qwen3 fp8-block128 M=1 and M=4 and Qwen3 bf16 M=1 (``results/h200-session4``).

**GEMM2's tile width** (``gemm2_block_n``): GEMM2 may run wider column tiles than GEMM1 (same
BLOCK_M, as the align is shared); the tuner tries 128 at fp8-block128 prefill, where GEMM1's best
tile is 64 wide.

**GEMM2 programs walking column tiles** (``gemm2_n_tiles``): with N_TILES > 1 a GEMM2 program
computes that many adjacent column tiles of its row tile in one loop over tiles x K steps, so its
loads run ahead from one tile into the next. GEMM2's K is the intermediate size; at DeepSeek-V3@tp8
(I = 256, two K steps) a one-tile program ends before anything can be prefetched, and walking 8 tiles
made the layer 3-11% faster at M = 64-4096 on an H200 (``results/h200-session5``). With one tile the
loop is the plain K loop: run with one tile, the walking loop was up to 6% slower.

**GEMM1 as one MMA per K step** (``gemm1_merged``): the B tile holds the gate and up rows of the
tile's columns side by side ([BK, 2BN]), so each K step is one MMA twice as wide instead of a gate MMA
and an up MMA; the accumulator is parted after the loop. On an H200 at each point's best config it cut
the layer's time by 3.6-6.3% where that tile was 128x128 at 8 warps without Swap-AB, and was even or up
to 2.3% slower elsewhere (``results/h200-session6``), so the tuner tries it for 8-warp tiles only.

**x quantized by GEMM1** (``gemm1_quant_x``, fp8-block128 with a tile per slot): each K step reads x's
rows in bf16 and quantizes their 1x128 group itself, so the layer has no launch for x (``_a_block128``).

**h quantized by GEMM1** (fp8-block128, 128-wide GEMM1 tiles, no split-K): each row of a tile is one 1x128
group of h, so the epilogue takes its maximum, writes h in fp8 and the group's scale, and h has no
quantization launch. On an H200 at each fp8-block128 point of M >= 4 with 128-wide tiles it took 0.97-1.006x
the time of GEMM1 writing bf16 h and a launch quantizing it (``results/h200-session12/ab-session12.jsonl``);
tuned, 16x128 tiles with it became the best of Qwen3 fp8-block128 M = 4 to 256.

**GEMM1's weights by TMA** (``gemm1_tma``): the gate and up tiles come through a tensor descriptor of w13
as ``[E * 2I, hidden]`` instead of pointer tensors (the token rows stay pointer loads: they are gathered
by slot, which Hopper's TMA cannot do). On an H200 at each point's best config it made the fp8-block128
layers of M >= 1024 1.3-2.2% faster and the bf16 prefill ones up to 4% slower
(``results/h200-session10/gemm1-tma.jsonl``), so it is a field the tuner tries at fp8.

**Programmatic dependent launch** (with ``direct_route``, on sm90; ``kernels/pdl.py``): every Triton
launch of the layer (activation quantization, the GEMMs, the split-K activation, the top-k sum) is a
programmatic dependent, so its programs start while the previous launch ends. A GEMM program reads its
slot's expert from ``topk_ids`` (an input), then waits (``gdc_wait``) before reading anything a launch
of the layer wrote; the other launches wait first. Every program waits, so a launch never ends before
the one it follows. On an H200 at each point's best config, the GEMMs and the split-K activation as
dependents made six of the seven tile-per-slot decode points 0.3-7.4% faster, one even (Qwen3
fp8-block128 M=1 28.5 to 26.4 us, DeepSeek-V3@tp8 M=1 30.0 to 29.0 us); with the align step it was
within 1% either way, so it is used with a tile per slot only. The quantization and sum launches as
dependents too made all eight tile-per-slot points of the benchmark 0.2-6.7% faster (Qwen3
fp8-block128 M=4 58.0 to 54.1 us; ``results/h200-session6/ab-pdl-all.jsonl``). Asking L2 for each
program's weights before its K loop (``prefetch.global.L2``) made every point 14-57% slower (8-57%
with the dependent launch) and was dropped (``results/h200-session6/ab-pdl-prefetch.jsonl``).

**Split-K** (``split_k``, GEMM1 only): at decode a few experts x column tiles
leave most of the 132 SMs idle while each program walks the whole hidden
dimension (measured: DeepSeek-V3@tp8 at M=1, 64 programs, 1.1 TB/s). With
``split_k`` > 1 each program takes a share of the K steps and stores its gate and
up partial sums in its split's float32 ``[T, 2I]`` slice of a ``[split_k, T, 2I]``
buffer; a small ``_swiglu`` launch then adds the splits' partials and applies the
activation (the only place the fused epilogue is given up). Stored partials need no
zeroing launch and no atomics, and sum in a fixed order. For fp8-block128 that
launch also writes GEMM2's fp8 input and group scales, so h needs no quantization launch.

**GEMM2's first weights before its wait** (``gemm2_preload``, with a tile per slot and one column tile per
GEMM2 program): a GEMM2 program reads its expert from ``topk_ids`` and the weight tiles of its first two K steps
into registers, and only then waits for the launch before it, so with the dependent launch those reads run
while GEMM1 (or the split-K activation) ends. On an H200 at each tile-per-slot point's best config
(``results/h200-session15/ab-preload.jsonl``) the layer took 0.91x the time at DeepSeek-V3@tp8 fp8-block128 M=1
(22.0 to 20.1 us: GEMM2's K is two steps, all of its weights read early), 0.99-1.0x at Qwen3 fp8-block128 M = 1
and 4, 1.05-1.09x at Qwen3 bf16, whose two tiles are twice the registers, and even at Mixtral; the tuner tries
it at fp8. Asking L2 for those weights instead (``cp.async.bulk.prefetch.L2``, by GEMM2 before its wait or by
GEMM1) made 6 of these 8 points 5-15% slower (``ab-prefetch.jsonl``, same folder).

**GEMM2 split-K** (``gemm2_split_k``, with an atomic top-k sum): GEMM2's programs share a tile's K steps
and each adds its partial product into the output by the atomic sum, which adds the top-k slots anyway
(the routed weight scales each share alike), so no launch follows. Where GEMM2's grid is a fraction of
the SMs and its K long (Mixtral M=1: 2 experts x 32 tiles of 56 K steps) it made the layer 1.04x faster on
an H200, and Qwen3 fp8-block128 M=1 1.08x with the sum into the output (``results/h200-session11``).

**GEMM2's column chunks one after another** (``gemm2_columns_first``): GEMM2's programs run every row tile
of column chunk 0 (one program's columns), then of chunk 1, and so on, instead of grouping row tiles. The
atomic sum then adds into one chunk of the output's rows at a time; walking the row tiles first, a token's
top-k additions come far apart and, where the sum is larger than L2, its row has left L2 in between. On an
H200 it took 0.959x the time at DeepSeek-V3@tp8 fp8-block128 M=4096 (a 59 MB bf16 sum) and 0.988-1.055x at the
other prefill points (``results/h200-session12/ab-columns-first.jsonl``), so the tuner tries it where the
sum is larger than L2.

**Tail tiles** (``tail_tiles``, with the align step): the align pads each expert's slots to whole row tiles, so
an expert's last tile is often mostly padding (8-48% more rows than slots at the benchmark's points of M >= 1024,
at their best tiles). With ``tail_tiles`` = 1 a tile whose real slots fit in half of it runs at BLOCK_M / 2 rows
(with 2, a quarter where they fit there): a second (third) compiled path of the same tile code at that height,
chosen per program from its slot ids; without it the kernels are compiled as before (the same PTX). A balanced
routing, no row padded, made the points of M >= 1024 1.09-1.19x faster on an H200, but a tail tile still reads its
whole weight tile: half tails made Mixtral bf16 M=1024 1.046x faster at its best config and Qwen3 bf16 M=4096
up to 1.054x (tuned), and the fp8 points up to 1.085x slower (``results/h200-session16``), so the tuner tries
them at bf16 tiles of 128 rows.

Token counts are never compile-time constants: ``num_slots`` is declared
``do_not_specialize`` and the grid is sized from shapes alone (an upper bound
on padded blocks), so a stream of changing ``M`` reuses one compiled kernel
per tile config. Programs past the real padded length exit at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from moebench._interpret import interpreting
from moebench.errors import UserError
from moebench.kernels import pdl as dependent
from moebench.kernels.act_quant import quantize_act, quantize_groups_of, to_fp8
from moebench.routing import moe_align
from moebench.tile import TileConfig, tma_rows

QUANT_NONE, QUANT_ROWCOL, QUANT_BLOCK = 0, 1, 2
_QUANT = {None: QUANT_NONE, "tensor": QUANT_ROWCOL, "channel": QUANT_ROWCOL, "block128": QUANT_BLOCK}


@triton.jit
def _grid(m_vec, n_vec, SWAP_AB: tl.constexpr):
    """Outer sum of a per-token vector [BM] and a per-column vector [BN] in the tile's layout."""
    if SWAP_AB:
        return n_vec[:, None] + m_vec[None, :]  # [BN, BM]
    else:
        return m_vec[:, None] + n_vec[None, :]  # [BM, BN]


@triton.jit
def _grid_and(m_vec, n_vec, SWAP_AB: tl.constexpr):
    if SWAP_AB:
        return n_vec[:, None] & m_vec[None, :]
    else:
        return m_vec[:, None] & n_vec[None, :]


@triton.jit
def _grid_mul(m_vec, n_vec, SWAP_AB: tl.constexpr):
    if SWAP_AB:
        return n_vec[:, None] * m_vec[None, :]
    else:
        return m_vec[:, None] * n_vec[None, :]


@triton.jit
def _per_token(v, SWAP_AB: tl.constexpr):
    """A per-token vector [BM] broadcast over the tile's columns: [BM, 1] or, swapped, [1, BM]."""
    if SWAP_AB:
        return v[None, :]
    else:
        return v[:, None]


@triton.jit
def _load(ptrs, mask, IN_BOUNDS: tl.constexpr):
    """``ptrs`` loaded under ``mask`` (0 where false), or with no mask where the caller knows every pointer
    is in bounds: the mask's predicates then cost no instructions in the K loop."""
    if IN_BOUNDS:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _load_a(a_ptrs, row_ok, k_ok, EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr):
    """A K step's token rows. The rows of padding slots point at token 0, in bounds, but stay masked:
    unmasked, every padding row of every tile read token 0's row, and the layer got up to 1.5x slower on an
    H200 (results/h200-session8). With ``EVEN_K`` that loop-invariant row mask is the only one."""
    if EVEN_K:
        return tl.load(a_ptrs, mask=_per_token(row_ok, SWAP_AB), other=0.0)
    else:
        return tl.load(a_ptrs, mask=_grid_and(row_ok, k_ok, SWAP_AB), other=0.0)


@triton.jit
def _a_block128(a_ptrs, x_scale_ptr, tok, k, row_ok, k_ok, stride_xsm, stride_xsk, fp8_dtype: tl.constexpr,
                EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr, X_QUANT: tl.constexpr, ROUND_FIRST: tl.constexpr):
    """fp8-block128 K step ``k``: the token rows in fp8 and their 1x128 group scales [BM].

    ``X_QUANT`` (``gemm1_quant_x``, with a tile per slot): the rows are read in x's dtype and quantized
    here by ``act_quant.quantize_groups_of``, as the quantization launch does (the same bits), so x needs no
    quantization launch. On an H200 at the best configs (results/h200-session9/ab-fusions.jsonl) the layer got faster
    where a program walks 4 K steps or fewer (split-K at M=1: DeepSeek-V3@tp8 27.1 to 26.4 us, Qwen3 26.6
    to 25.4) and 1.07-1.13x slower where it walks 14-16 (M=4): the conversion stands between each step's
    load and its MMA. So it is a tile-config field the tuner tries at decode."""
    a = _load_a(a_ptrs, row_ok, k_ok, EVEN_K, SWAP_AB)
    if X_QUANT:  # a [BK, BM] swapped, else [BM, BK]: a token's group is a column, else a row
        a, xs = quantize_groups_of(a.to(tl.float32), 0 if SWAP_AB else 1, fp8_dtype, ROUND_FIRST)
    else:
        xs = tl.load(x_scale_ptr + tok * stride_xsm + k * stride_xsk)
    return a, xs


@triton.jit
def _block_scale(xs, ws, n_first, offs_n, n_ok, stride_wsn, ONE_BLOCK: tl.constexpr, SWAP_AB: tl.constexpr):
    """fp8-block128: the scale of one K step's product, the token rows' group scales ``xs`` [BM] times the
    weight-block scale of each column (``ws``: the expert's scales at this K step, a row per 128 weight
    rows). With ``ONE_BLOCK`` the tile's columns from ``n_first`` lie in one block (EVEN_N, BLOCK_N <= 128):
    one weight scale, so a per-token vector; else one per column ``offs_n``, masked by ``n_ok``."""
    if ONE_BLOCK:
        return _per_token(xs * tl.load(ws + (n_first // 128) * stride_wsn), SWAP_AB)
    else:
        return _grid_mul(xs, tl.load(ws + (offs_n // 128) * stride_wsn, mask=n_ok, other=0.0), SWAP_AB)


@triton.jit
def _mma(a, b, acc, SWAP_AB: tl.constexpr):
    """acc += a @ b, with a [BM, BK] / b [BK, BN] or, swapped, b [BN, BK] @ a [BK, BM]."""
    if SWAP_AB:
        return tl.dot(b, a, acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _halves(acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """The gate and up tiles of GEMM1's merged accumulator, whose columns (rows when swapped) alternate
    gate n, up n: [BM, 2BN] -> two [BM, BN], or [2BN, BM] -> two [BN, BM]."""
    if SWAP_AB:
        return tl.split(tl.permute(tl.reshape(acc, (BLOCK_N, 2, BLOCK_M)), (0, 2, 1)))
    else:
        return tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))


@triton.jit
def _tile_coords(pid, max_pid_m, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                 COLUMNS_FIRST: tl.constexpr = False):
    """Map tile number ``pid`` to (pid_m, pid_n), grouping GROUP_M row tiles for weight reuse in L2, or
    with ``COLUMNS_FIRST`` every row tile of column tile 0, then of column tile 1, and so on.

    The layout covers ``max_pid_m`` row tiles (the grid's bound, not the used count), so no
    load precedes the slot and expert loads; programs whose row tile lies past the align's
    used length skip it (``_tile_slots``).
    """
    if COLUMNS_FIRST:
        return pid % max_pid_m, pid // max_pid_m
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(max_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _k_share(k_steps, SPLIT_K: tl.constexpr):
    """This program's K steps [k_first, k_last): all ``k_steps``, or with SPLIT_K > 1 its split's share,
    the split being the program id modulo SPLIT_K (a tile's splits are adjacent programs)."""
    if SPLIT_K == 1:
        return 0, k_steps
    else:
        per_split = tl.cdiv(k_steps, SPLIT_K)
        k_first = (tl.program_id(0) % SPLIT_K) * per_split
        return k_first, tl.minimum(k_first + per_split, k_steps)


@triton.jit
def _tile_slots(pid_m, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, BLOCK_M: tl.constexpr,
                DIRECT: tl.constexpr, PDL: tl.constexpr, WAIT_DIRECT: tl.constexpr = True):
    """The row tile's slot ids [BLOCK_M], its expert, and whether it lies within the used length.

    The three loads are independent, so they are in flight together. The used length was loaded
    first before, a second memory round trip ahead of every program's first operand load. With the
    relaxed atomics and the Triton top-k sum, this read 2.5-11% faster on an H200
    (results/h200-session3-ab; that A/B timed the old kernels first, which can overstate by up to 8%).

    ``DIRECT`` (no align step): row tile ``pid_m`` is token slot ``pid_m`` alone, in its first row,
    and ``expert_ids_ptr`` is ``topk_ids`` flattened ``[T]``.

    ``PDL`` (a dependent launch, ``kernels/pdl.py``): the align's output comes from earlier launches, so
    the program waits before loading it; ``topk_ids`` is an input of the layer, so with ``DIRECT`` the
    expert is loaded first and the program waits after (without ``WAIT_DIRECT`` the caller waits, once it
    has loaded what else it may read early). Every program waits either way.
    """
    dependent.start(PDL, WAIT=not DIRECT)
    if DIRECT:
        valid = pid_m < num_slots
        slot = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_slots)  # [BLOCK_M]; one real row
        expert = tl.load(expert_ids_ptr + pid_m, mask=valid, other=0).to(tl.int64)
        if WAIT_DIRECT:
            dependent.wait(PDL)
    else:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        slot = tl.load(sorted_ids_ptr + offs_m)  # [BLOCK_M]; within the grid's bound, so never past the end
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        valid = pid_m * BLOCK_M < tl.load(num_padded_ptr)
    return slot, expert, valid


@triton.jit(do_not_specialize=["num_slots", "max_pid_m", "stride_split", "zero_numel"])
def _gemm1_swiglu(
    x_ptr,  # [M, K] activations (fp8 when QUANT, unless X_QUANT)
    w_ptr,  # [E, 2N, K] gate rows then up rows
    h_ptr,  # [T, N] output activation, row = token slot; SPLIT_K > 1: [SPLIT_K, T, 2N] float32, gate|up partials
    h_scale_ptr,  # STATIC_OUT: [1] float32, the static scale fp8 h is written at; GROUP_OUT: [T, cdiv(N, 128)]
    x_scale_ptr,  # QUANT 1: [M] (stride 0 for one tensor scale); QUANT 2: [M, cdiv(K, 128)]
    w_scale_ptr,  # QUANT 1: [E, 2N] (stride 0 per tensor); QUANT 2: [E, cdiv(2N, 128), cdiv(K, 128)]
    sorted_ids_ptr,  # [max_padded] slot ids grouped by expert; == num_slots for padding
    expert_ids_ptr,  # [max_blocks]
    num_padded_ptr,  # [1]
    num_slots,  # T = M * topk
    max_pid_m,  # max_blocks: the grid's bound on row tiles
    N,  # I
    K,  # hidden
    stride_xm,
    stride_we,
    stride_wn,
    stride_hm,
    stride_split,  # SPLIT_K > 1: elements between the splits' [T, 2N] slices (T * 2N)
    stride_hsm,  # GROUP_OUT: h_scale's row stride
    stride_xsm,
    stride_xsk,
    stride_wse,
    stride_wsn,
    stride_wsk,
    TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr,
    QUANT: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DIRECT: tl.constexpr,
    MERGED: tl.constexpr,  # one MMA per K step over gate and up rows together (gemm1_merged)
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask on the operand loads
    EVEN_N: tl.constexpr,  # N % BLOCK_N == 0: no column mask on weight loads; one block128 scale per tile (BN <= 128)
    PDL: tl.constexpr,  # launched as a programmatic dependent: wait for the previous launch before its data
    STATIC_OUT: tl.constexpr,  # h written in fp8 at a static per-tensor scale (fp8-tensor-static, SPLIT_K == 1)
    GROUP_OUT: tl.constexpr,  # QUANT 2, BLOCK_N == 128, SPLIT_K == 1: h written in fp8, the tile one 1x128 group
    ROUND_FIRST: tl.constexpr,
    X_QUANT: tl.constexpr,  # QUANT 2: x read in its own dtype and quantized in the K loop (x_scale_ptr unused)
    w_desc,  # TMA_W: a tensor descriptor of w13 as [E * 2N, K], blocks [BLOCK_N, BLOCK_K]; else None
    TMA_W: tl.constexpr,  # the weight tiles read by TMA (gemm1_tma)
    zero_ptr,  # ZERO: GEMM2's atomic top-k sums [M, hidden] (the output, or float32), contiguous
    zero_numel,  # ZERO: M * hidden
    ZERO: tl.constexpr,  # every program zeroes its share of zero_ptr, for GEMM2 to add into
    TAIL: tl.constexpr,  # an expert's last row tile at BLOCK_M / 2 (or / 4 with 2) rows where its slots fit
    amax_ptr,  # AMAX_OUT: [grid] float32, each program's absolute maximum of the h it wrote (0 where none)
    AMAX_OUT: tl.constexpr,  # SPLIT_K == 1, h not quantized here: for a dynamic per-tensor scale of h
):
    pid_m, pid_n = _tile_coords(tl.program_id(0) // SPLIT_K, max_pid_m, N, BLOCK_M, BLOCK_N, GROUP_M)
    slot, expert, valid = _tile_slots(pid_m, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, BLOCK_M,
                                      DIRECT, PDL)
    if ZERO:  # after _tile_slots' wait: an earlier launch may still be writing the sums' memory
        _zero_share(zero_ptr, zero_numel)
    if valid:
        rows = _tile_rows(slot, num_slots, BLOCK_M, TAIL)
        for i in tl.static_range(TAIL + 1):  # a path per tile height: BLOCK_M, then the tails'
            if rows == BLOCK_M >> i:
                _gemm1_tile(_head_slots(slot, sorted_ids_ptr, pid_m, BLOCK_M, BLOCK_M >> i), expert, pid_n, x_ptr,
                            w_ptr, h_ptr, h_scale_ptr, x_scale_ptr, w_scale_ptr, num_slots, N, K, stride_xm, stride_we,
                            stride_wn, stride_hm, stride_split, stride_hsm, stride_xsm, stride_xsk, stride_wse,
                            stride_wsn, stride_wsk, w_desc, amax_ptr, TOPK, BLOCK_M >> i, BLOCK_N, BLOCK_K, SWAP_AB,
                            QUANT, SPLIT_K, MERGED, EVEN_K, EVEN_N, STATIC_OUT, GROUP_OUT, ROUND_FIRST, X_QUANT, TMA_W,
                            AMAX_OUT)
    elif AMAX_OUT:
        tl.store(amax_ptr + tl.program_id(0), 0.0)


@triton.jit
def _tile_rows(slot, num_slots, BLOCK_M: tl.constexpr, TAIL: tl.constexpr):
    """The rows a row tile runs at (``tail_tiles``): BLOCK_M, or BLOCK_M >> i for the largest i <= TAIL at
    which its real slots (first in the tile: the align pads after them) fit. Without TAIL, BLOCK_M."""
    rows = tl.full((), BLOCK_M, tl.int32)
    if TAIL > 0:
        real = tl.sum((slot < num_slots).to(tl.int32))
        for i in tl.static_range(1, TAIL + 1):
            rows = tl.where(real <= BLOCK_M >> i, BLOCK_M >> i, rows)
    return rows


@triton.jit
def _head_slots(slot, sorted_ids_ptr, pid_m, BLOCK_M: tl.constexpr, ROWS: tl.constexpr):
    """The first ROWS of row tile ``pid_m``'s slot ids ``slot`` [BLOCK_M], read again for a tail tile."""
    if ROWS == BLOCK_M:
        return slot
    else:
        return tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, ROWS))


@triton.jit
def _gemm1_tile(slot, expert, pid_n, x_ptr, w_ptr, h_ptr, h_scale_ptr, x_scale_ptr, w_scale_ptr, num_slots, N, K,
                stride_xm, stride_we, stride_wn, stride_hm, stride_split, stride_hsm, stride_xsm, stride_xsk,
                stride_wse, stride_wsn, stride_wsk, w_desc, amax_ptr, TOPK: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr, QUANT: tl.constexpr,
                SPLIT_K: tl.constexpr, MERGED: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                STATIC_OUT: tl.constexpr, GROUP_OUT: tl.constexpr, ROUND_FIRST: tl.constexpr, X_QUANT: tl.constexpr,
                TMA_W: tl.constexpr, AMAX_OUT: tl.constexpr):
    """One GEMM1 tile of the slots ``slot`` [BLOCK_M] of ``expert``, columns ``pid_n``: its K loop and epilogue
    (the arguments are the kernel's)."""
    row_ok = slot < num_slots
    tok = tl.where(row_ok, slot // TOPK, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)

    k_first, k_last = _k_share(tl.cdiv(K, BLOCK_K), SPLIT_K)  # this program's K steps

    a_ptrs = x_ptr + _grid(tok * stride_xm, offs_k + k_first * BLOCK_K, SWAP_AB)  # [BM, BK] or [BK, BM]
    w_ptr += expert * stride_we
    if MERGED:
        acc_g, acc_u = _gemm1_loop_merged(a_ptrs, w_ptr, x_scale_ptr, w_scale_ptr, tok, expert, row_ok, pid_n,
                                          offs_k, k_first, k_last, N, K, stride_wn, stride_xsm, stride_xsk,
                                          stride_wse, stride_wsn, stride_wsk, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB,
                                          QUANT, EVEN_K, EVEN_N, X_QUANT, ROUND_FIRST)
    else:
        acc_g, acc_u = _gemm1_loop_pair(a_ptrs, w_ptr, x_scale_ptr, w_scale_ptr, tok, expert, row_ok,
                                        pid_n * BLOCK_N, offs_n, n_ok, offs_k, k_first, k_last, N, K, stride_wn,
                                        stride_xsm, stride_xsk, stride_wse, stride_wsn, stride_wsk, BLOCK_M,
                                        BLOCK_N, BLOCK_K, SWAP_AB, QUANT, EVEN_K, EVEN_N, X_QUANT,
                                        ROUND_FIRST, w_desc, TMA_W)  # [BM, BN] or [BN, BM] each

    slot_safe = tl.where(row_ok, slot, 0).to(tl.int64)
    mask = _grid_and(row_ok, n_ok, SWAP_AB)
    if SPLIT_K == 1:
        h = acc_g * tl.sigmoid(acc_g) * acc_u  # silu(gate) * up
        h_ptrs = h_ptr + _grid(slot_safe * stride_hm, offs_n, SWAP_AB)
        if STATIC_OUT:  # GEMM2's fp8 input, with no quantization launch
            h = tl.minimum(tl.maximum(h / tl.load(h_scale_ptr), -448.0), 448.0)
            tl.store(h_ptrs, to_fp8(h, h_ptr.dtype.element_ty, ROUND_FIRST), mask=mask)
        elif GROUP_OUT:  # GEMM2's fp8-block128 input: each token row of the tile is one group
            h = tl.where(mask, h, 0.0)  # columns past N (with TMA_W, read from other rows) out of the max
            q, scale = quantize_groups_of(h, 0 if SWAP_AB else 1, h_ptr.dtype.element_ty, ROUND_FIRST)  # [BM]
            tl.store(h_ptrs, q, mask=mask)
            tl.store(h_scale_ptr + slot_safe * stride_hsm + pid_n, scale, mask=row_ok)
        else:
            h = h.to(h_ptr.dtype.element_ty)
            tl.store(h_ptrs, h, mask=mask)
            if AMAX_OUT:  # the maximum of the values stored, so h's scale is the one a launch would find
                tl.store(amax_ptr + tl.program_id(0), tl.max(tl.where(mask, tl.abs(h.to(tl.float32)), 0.0)))
    else:  # this split's partial sums; _swiglu adds the splits' and applies the activation
        split = (tl.program_id(0) % SPLIT_K).to(tl.int64)
        gu_ptrs = h_ptr + split * stride_split + _grid(slot_safe * stride_hm, offs_n, SWAP_AB)
        tl.store(gu_ptrs, acc_g, mask=mask)
        tl.store(gu_ptrs + N, acc_u, mask=mask)


# Elements per store of GEMM1's zeroing of the sums (``_zero_share``): 2 KB of bf16, 4 KB of float32.
ZERO_BLOCK = tl.constexpr(1024)
# The largest sums GEMM1 zeroes; larger ones are zeroed before it, by x's quantization launch at fp8-block128,
# else by a launch of their own. On an H200 at each point's best config (results/h200-session12/
# ab-zero-in-gemm1.jsonl) GEMM1 zeroing took 0.955-1.002x the time at the 21 points of M <= 64 (sums up to
# 0.9 MB; Qwen3 fp8-block128 M=1 24.2 to 23.1 us), 0.996-1.002x at M=256 and 0.989-1.086x at M >= 1024
# (Mixtral bf16 and fp8-tensor M=4096, 34 MB: 1.073x and 1.086x).
ZERO_IN_GEMM1_BYTES = 1 << 20


@triton.jit
def _zero_share(ptr, numel):
    """Zero this program's share of the ``numel`` elements from ``ptr``: each program of the grid (valid
    tile or not) a run of whole ZERO_BLOCKs, stored with no mask (so in 16-byte vectors), and program 0
    the last partial block."""
    zeros = tl.zeros((ZERO_BLOCK,), dtype=ptr.dtype.element_ty)
    full = numel // ZERO_BLOCK  # blocks wholly inside
    share = tl.cdiv(full, tl.num_programs(0))  # blocks per program
    first = tl.program_id(0).to(tl.int64) * share
    for block in range(first, tl.minimum(first + share, full)):
        tl.store(ptr + block * ZERO_BLOCK + tl.arange(0, ZERO_BLOCK), zeros)
    if tl.program_id(0) == 0:
        offs = full.to(tl.int64) * ZERO_BLOCK + tl.arange(0, ZERO_BLOCK)
        tl.store(ptr + offs, zeros, mask=offs < numel)


@triton.jit
def _gemm1_loop_pair(a_ptrs, w_ptr, x_scale_ptr, w_scale_ptr, tok, expert, row_ok, n_first, offs_n, n_ok, offs_k,
                     k_first, k_last, N, K, stride_wn, stride_xsm, stride_xsk, stride_wse, stride_wsn, stride_wsk,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr,
                     QUANT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, X_QUANT: tl.constexpr,
                     ROUND_FIRST: tl.constexpr, w_desc, TMA_W: tl.constexpr):
    """GEMM1's K steps ``[k_first, k_last)`` of one tile as a gate MMA and an up MMA per step:
    the gate and up accumulators, [BM, BN] each ([BN, BM] swapped). ``w_ptr`` is the expert's w13.

    With ``EVEN_K`` the loads carry no K mask (``_load_a``); with ``EVEN_N`` too, the weight loads carry
    no mask at all, and at fp8-block128 the tile's gate (and up) columns lie in one 128-row weight block
    (BLOCK_N divides 128 and N), so each K step reads one gate and one up scale and scales the product by
    a per-token vector: one FMA per element.

    ``TMA_W``: the gate and up tiles are read by TMA through ``w_desc`` (rows of w13 as [E * 2N, K]), with
    no pointer tensors; past K, TMA reads zeros, and rows past N (the up rows, or the next expert's) feed
    only columns the store masks."""
    g_row = (expert * 2 * N + n_first).to(tl.int32)  # TMA_W: the gate tile's first row of w13 as [E * 2N, K]
    g_ptrs = w_ptr + _grid(offs_k + k_first * BLOCK_K, offs_n * stride_wn, SWAP_AB)  # [BK, BN] or [BN, BK]
    u_ptrs = g_ptrs + N * stride_wn
    acc_g = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_first, k_last):
        k_ok = offs_k < K - k * BLOCK_K
        if TMA_W:
            g = w_desc.load([g_row, k * BLOCK_K])  # [BN, BK]
            u = w_desc.load([g_row + N, k * BLOCK_K])
            if not SWAP_AB:
                g = g.T
                u = u.T
        else:
            b_mask = _grid_and(k_ok, n_ok, SWAP_AB)
            g = _load(g_ptrs, b_mask, EVEN_K and EVEN_N)
            u = _load(u_ptrs, b_mask, EVEN_K and EVEN_N)
        if QUANT == 2:  # 128x128 blocks: scale each K step's partial product
            a, xs = _a_block128(a_ptrs, x_scale_ptr, tok, k, row_ok, k_ok, stride_xsm, stride_xsk,
                                w_ptr.dtype.element_ty, EVEN_K, SWAP_AB, X_QUANT, ROUND_FIRST)  # xs [BM]
            ws = w_scale_ptr + expert * stride_wse + k * stride_wsk
            g_scale = _block_scale(xs, ws, n_first, offs_n, n_ok, stride_wsn, EVEN_N and BLOCK_N <= 128, SWAP_AB)
            u_scale = _block_scale(xs, ws, N + n_first, N + offs_n, n_ok, stride_wsn, EVEN_N and BLOCK_N <= 128,
                                   SWAP_AB)
            acc_g += _mma(a, g, tl.zeros_like(acc_g), SWAP_AB) * g_scale
            acc_u += _mma(a, u, tl.zeros_like(acc_u), SWAP_AB) * u_scale
        else:
            a = _load_a(a_ptrs, row_ok, k_ok, EVEN_K, SWAP_AB)
            acc_g = _mma(a, g, acc_g, SWAP_AB)
            acc_u = _mma(a, u, acc_u, SWAP_AB)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    if QUANT == 1:  # per-token activation scale x per-column weight scale, once
        xs = tl.load(x_scale_ptr + tok * stride_xsm)  # [BM]
        ws = w_scale_ptr + expert * stride_wse
        acc_g *= _grid_mul(xs, tl.load(ws + offs_n * stride_wsn, mask=n_ok, other=0.0), SWAP_AB)
        acc_u *= _grid_mul(xs, tl.load(ws + (N + offs_n) * stride_wsn, mask=n_ok, other=0.0), SWAP_AB)
    return acc_g, acc_u


@triton.jit
def _gemm1_loop_merged(a_ptrs, w_ptr, x_scale_ptr, w_scale_ptr, tok, expert, row_ok, pid_n, offs_k, k_first,
                       k_last, N, K, stride_wn, stride_xsm, stride_xsk, stride_wse, stride_wsn, stride_wsk,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr,
                       QUANT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, X_QUANT: tl.constexpr,
                       ROUND_FIRST: tl.constexpr):
    """As ``_gemm1_loop_pair``, with one MMA per K step over a B tile of 2*BLOCK_N weight rows, gate row n
    and up row n side by side ([BM, BK] x [BK, 2BN], swapped [2BN, BK] x [BK, BM]); the accumulator is
    parted into gate and up after the loop (``_halves``)."""
    offs_c = tl.arange(0, 2 * BLOCK_N)
    col = pid_n * BLOCK_N + offs_c // 2  # [2BN] the column of h each B column feeds
    w_rows = col + (offs_c % 2) * N  # [2BN] even: gate row, odd: up row
    c_ok = col < N
    b_ptrs = w_ptr + _grid(offs_k + k_first * BLOCK_K, w_rows * stride_wn, SWAP_AB)  # [BK, 2BN] or [2BN, BK]
    acc = tl.zeros((2 * BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
    for k in range(k_first, k_last):
        k_ok = offs_k < K - k * BLOCK_K
        b = _load(b_ptrs, _grid_and(k_ok, c_ok, SWAP_AB), EVEN_K and EVEN_N)
        if QUANT == 2:
            a, xs = _a_block128(a_ptrs, x_scale_ptr, tok, k, row_ok, k_ok, stride_xsm, stride_xsk,
                                w_ptr.dtype.element_ty, EVEN_K, SWAP_AB, X_QUANT, ROUND_FIRST)  # xs [BM]
            ws = tl.load(w_scale_ptr + expert * stride_wse + k * stride_wsk + (w_rows // 128) * stride_wsn,
                         mask=c_ok, other=0.0)  # [2BN]
            acc += _mma(a, b, tl.zeros_like(acc), SWAP_AB) * _grid_mul(xs, ws, SWAP_AB)
        else:
            acc = _mma(_load_a(a_ptrs, row_ok, k_ok, EVEN_K, SWAP_AB), b, acc, SWAP_AB)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if QUANT == 1:
        xs = tl.load(x_scale_ptr + tok * stride_xsm)  # [BM]
        ws = tl.load(w_scale_ptr + expert * stride_wse + w_rows * stride_wsn, mask=c_ok, other=0.0)  # [2BN]
        acc *= _grid_mul(xs, ws, SWAP_AB)
    return _halves(acc, BLOCK_M, BLOCK_N, SWAP_AB)


@triton.jit
def _split_sum(gu_ptr, offs, ok, stride_split, SPLIT_K: tl.constexpr):
    """The splits' partials at ``offs`` of one [T, 2N] slice, added in split order."""
    acc = tl.load(gu_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(gu_ptr + s * stride_split + offs, mask=ok, other=0.0)
    return acc


@triton.jit(do_not_specialize=["stride_split"])
def _swiglu(gu_ptr, h_ptr, h_scale_ptr, N, stride_hsm, stride_split, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr,
            QUANT_OUT: tl.constexpr, BLOCK_G: tl.constexpr, ROUND_FIRST: tl.constexpr, PDL: tl.constexpr):
    """h[r] = silu(gate) * up for one row r per program after a split-K GEMM1, where gate and up are the
    sums over the SPLIT_K slices of ``gu`` [SPLIT_K, T, 2N] of its row's [:N] and [N:].

    With ``QUANT_OUT`` h is written as fp8 with one scale per 1x128 group (GEMM2's fp8-block128
    input, with no quantization launch of its own), BLOCK_G groups at a time as one [BLOCK_G, 128] tile.
    """
    row = tl.program_id(0).to(tl.int64)
    dependent.start(PDL)
    if QUANT_OUT:
        for n in range(0, N, BLOCK_G * 128):
            groups = n // 128 + tl.arange(0, BLOCK_G)  # [BLOCK_G]
            offs = groups[:, None] * 128 + tl.arange(0, 128)[None, :]  # [BLOCK_G, 128]
            ok = offs < N
            g = _split_sum(gu_ptr, row * 2 * N + offs, ok, stride_split, SPLIT_K)
            u = _split_sum(gu_ptr, row * 2 * N + N + offs, ok, stride_split, SPLIT_K)
            h = g * tl.sigmoid(g) * u
            q, scale = quantize_groups_of(h, 1, h_ptr.dtype.element_ty, ROUND_FIRST)  # scale [BLOCK_G]
            tl.store(h_ptr + row * N + offs, q, mask=ok)
            tl.store(h_scale_ptr + row * stride_hsm + groups, scale, mask=groups * 128 < N)
    else:
        for n in range(0, N, BLOCK_N):
            offs = n + tl.arange(0, BLOCK_N)
            ok = offs < N
            g = _split_sum(gu_ptr, row * 2 * N + offs, ok, stride_split, SPLIT_K)
            u = _split_sum(gu_ptr, row * 2 * N + N + offs, ok, stride_split, SPLIT_K)
            tl.store(h_ptr + row * N + offs, (g * tl.sigmoid(g) * u).to(h_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["num_slots", "max_pid_m"])
def _gemm2_combine(
    h_ptr,  # [T, K] activation from GEMM1 (fp8 when QUANT)
    w_ptr,  # [E, N, K]
    out_ptr,  # ATOMIC_SUM: [M, N] float32 or the output, zeroed, a token's slots add into its row; else [T, N] by slot
    h_scale_ptr,  # QUANT 1: [T] (stride 0 for one tensor scale); QUANT 2: [T, cdiv(K, 128)]
    w_scale_ptr,  # QUANT 1: [E, N] (stride 0 per tensor); QUANT 2: [E, cdiv(N, 128), cdiv(K, 128)]
    topk_weights_ptr,  # [T] float32 routed weights, row-major [M, topk]
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    num_slots,
    max_pid_m,
    N,  # hidden
    K,  # I
    stride_hm,
    stride_we,
    stride_wn,
    stride_om,
    stride_hsm,
    stride_hsk,
    stride_wse,
    stride_wsn,
    stride_wsk,
    TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr,
    QUANT: tl.constexpr,
    ATOMIC_SUM: tl.constexpr,
    DIRECT: tl.constexpr,
    N_TILES: tl.constexpr,  # column tiles per program (gemm2_n_tiles)
    SPLIT_K: tl.constexpr,  # programs per tile, each over a share of the K steps (gemm2_split_k; ATOMIC_SUM)
    PDL: tl.constexpr,  # as in _gemm1_swiglu
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0
    EVEN_N: tl.constexpr,  # N % (BLOCK_N * N_TILES) == 0: every program's column tiles lie within N
    COLUMNS_FIRST: tl.constexpr,  # every row tile of a column chunk before the next (gemm2_columns_first)
    PRELOAD: tl.constexpr,  # DIRECT, N_TILES == 1: the first two K steps' weights loaded before the wait
    TAIL: tl.constexpr,  # as in _gemm1_swiglu
):
    pid_m, pid_n = _tile_coords(tl.program_id(0) // SPLIT_K, max_pid_m, N, BLOCK_M, BLOCK_N * N_TILES, GROUP_M,
                                COLUMNS_FIRST)
    slot, expert, valid = _tile_slots(pid_m, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, BLOCK_M,
                                      DIRECT, PDL, WAIT_DIRECT=not PRELOAD)
    b0, b1 = None, None
    if PRELOAD:  # the first two K steps' weights, an input of the layer, read while the launch before ends
        b0, b1 = _gemm2_preload(w_ptr, expert, valid, pid_n, N, K, stride_we, stride_wn, BLOCK_N, BLOCK_K, SWAP_AB,
                                SPLIT_K)
        dependent.wait(PDL)  # every program waits, valid or not
    if valid:
        rows = _tile_rows(slot, num_slots, BLOCK_M, TAIL)
        for i in tl.static_range(TAIL + 1):  # a path per tile height, as in GEMM1
            if rows == BLOCK_M >> i:
                _gemm2_tile(_head_slots(slot, sorted_ids_ptr, pid_m, BLOCK_M, BLOCK_M >> i), expert, pid_n, b0, b1,
                            h_ptr, w_ptr, out_ptr, h_scale_ptr, w_scale_ptr, topk_weights_ptr, num_slots, N, K,
                            stride_hm, stride_we, stride_wn, stride_om, stride_hsm, stride_hsk, stride_wse, stride_wsn,
                            stride_wsk, TOPK, BLOCK_M >> i, BLOCK_N, BLOCK_K, SWAP_AB, QUANT, ATOMIC_SUM, N_TILES,
                            SPLIT_K, EVEN_K, EVEN_N, PRELOAD)


@triton.jit
def _gemm2_tile(slot, expert, pid_n, b0, b1, h_ptr, w_ptr, out_ptr, h_scale_ptr, w_scale_ptr, topk_weights_ptr,
                num_slots, N, K, stride_hm, stride_we, stride_wn, stride_om, stride_hsm, stride_hsk, stride_wse,
                stride_wsn, stride_wsk, TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr, QUANT: tl.constexpr, ATOMIC_SUM: tl.constexpr,
                N_TILES: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                PRELOAD: tl.constexpr):
    """One GEMM2 program's tile of the slots ``slot`` [BLOCK_M] of ``expert``, column chunk ``pid_n``: its
    K loop(s) and epilogue(s); ``b0``, ``b1`` the preloaded weights (PRELOAD). The arguments are the kernel's."""
    row_ok = slot < num_slots
    slot_safe = tl.where(row_ok, slot, 0).to(tl.int64)
    n_first = pid_n * N_TILES * BLOCK_N
    offs_n = n_first + tl.arange(0, BLOCK_N)  # the first column tile
    offs_k = tl.arange(0, BLOCK_K)

    a_ptrs = h_ptr + _grid(slot_safe * stride_hm, offs_k, SWAP_AB)
    b_ptrs = w_ptr + expert * stride_we + _grid(offs_k, offs_n * stride_wn, SWAP_AB)
    acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_steps = tl.cdiv(K, BLOCK_K)
    if N_TILES == 1:
        # This program's share of the K steps: with SPLIT_K > 1 one split's, whose partial sum the atomic
        # epilogue adds like another slot's (the routed weight scales each share alike).
        k_first, k_last = _k_share(k_steps, SPLIT_K)
        a_ptrs += k_first * BLOCK_K
        b_ptrs += k_first * BLOCK_K
        if PRELOAD:  # its first two steps with the weights read before the wait
            for i in tl.static_range(2):
                if k_first + i < k_last:
                    a = _load_a(a_ptrs + i * BLOCK_K, row_ok, offs_k < K - (k_first + i) * BLOCK_K, EVEN_K,
                                SWAP_AB)
                    acc = _gemm2_mma(acc, a, b1 if i else b0, k_first + i, n_first, offs_n, offs_n < N, slot_safe,
                                     expert, h_scale_ptr, w_scale_ptr, stride_hsm, stride_hsk, stride_wse,
                                     stride_wsn, stride_wsk, BLOCK_N, SWAP_AB, QUANT, EVEN_N)
            k_first += 2
            a_ptrs += 2 * BLOCK_K
            b_ptrs += 2 * BLOCK_K
        for k in range(k_first, k_last):
            acc = _gemm2_step(acc, a_ptrs, b_ptrs, k, offs_k, n_first, offs_n, row_ok, slot_safe, expert,
                              h_scale_ptr, w_scale_ptr, K, N, stride_hsm, stride_hsk, stride_wse, stride_wsn,
                              stride_wsk, BLOCK_N, BLOCK_K, SWAP_AB, QUANT, EVEN_K, EVEN_N)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        _gemm2_epilogue(acc, slot_safe, row_ok, offs_n, expert, out_ptr, topk_weights_ptr, h_scale_ptr,
                        w_scale_ptr, N, stride_om, stride_hsm, stride_wse, stride_wsn, TOPK, BLOCK_N, SWAP_AB,
                        QUANT, ATOMIC_SUM)
    else:
        # One loop over the column tiles x the K steps, so the loads run ahead across column tiles.
        for t in range(0, N_TILES * k_steps):
            j = t // k_steps
            k = t - j * k_steps
            acc = _gemm2_step(acc, a_ptrs + k * BLOCK_K, b_ptrs + (j * BLOCK_N * stride_wn + k * BLOCK_K), k,
                              offs_k, n_first + j * BLOCK_N, offs_n + j * BLOCK_N, row_ok, slot_safe, expert,
                              h_scale_ptr, w_scale_ptr, K, N, stride_hsm, stride_hsk, stride_wse, stride_wsn,
                              stride_wsk, BLOCK_N, BLOCK_K, SWAP_AB, QUANT, EVEN_K, EVEN_N)
            if k == k_steps - 1:
                _gemm2_epilogue(acc, slot_safe, row_ok, offs_n + j * BLOCK_N, expert, out_ptr,
                                topk_weights_ptr, h_scale_ptr, w_scale_ptr, N, stride_om, stride_hsm, stride_wse,
                                stride_wsn, TOPK, BLOCK_N, SWAP_AB, QUANT, ATOMIC_SUM)
                acc = tl.zeros_like(acc)


@triton.jit
def _gemm2_preload(w_ptr, expert, valid, pid_n, N, K, stride_we, stride_wn, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr, SPLIT_K: tl.constexpr):
    """``gemm2_preload`` (a tile per slot, one column tile per program): the weight tiles of the program's
    first two K steps, read before it waits for the launch before it; zeros (nothing read) for a step past
    its share or a program past the slots."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_first, k_last = _k_share(tl.cdiv(K, BLOCK_K), SPLIT_K)
    b_ptrs = w_ptr + expert * stride_we + _grid(offs_k + k_first * BLOCK_K, offs_n * stride_wn, SWAP_AB)
    b0 = _gemm2_load_b(b_ptrs, k_first, offs_k, offs_n, K, N, valid & (k_first < k_last), BLOCK_K, SWAP_AB)
    b1 = _gemm2_load_b(b_ptrs + BLOCK_K, k_first + 1, offs_k, offs_n, K, N, valid & (k_first + 1 < k_last),
                       BLOCK_K, SWAP_AB)
    return b0, b1


@triton.jit
def _gemm2_step(acc, a_ptrs, b_ptrs, k, offs_k, n_first, offs_n, row_ok, slot_safe, expert, h_scale_ptr, w_scale_ptr,
                K, N, stride_hsm, stride_hsk, stride_wse, stride_wsn, stride_wsk, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr, QUANT: tl.constexpr, EVEN_K: tl.constexpr,
                EVEN_N: tl.constexpr):
    """acc plus K step ``k`` of one column tile (``a_ptrs`` / ``b_ptrs`` at that step, columns ``offs_n``
    from ``n_first``); the masks and block128 weight scales as in ``_gemm1_loop_pair``."""
    k_ok = offs_k < K - k * BLOCK_K
    n_ok = offs_n < N
    a = _load_a(a_ptrs, row_ok, k_ok, EVEN_K, SWAP_AB)
    b = _load(b_ptrs, _grid_and(k_ok, n_ok, SWAP_AB), EVEN_K and EVEN_N)
    return _gemm2_mma(acc, a, b, k, n_first, offs_n, n_ok, slot_safe, expert, h_scale_ptr, w_scale_ptr,
                      stride_hsm, stride_hsk, stride_wse, stride_wsn, stride_wsk, BLOCK_N, SWAP_AB, QUANT, EVEN_N)


@triton.jit
def _gemm2_load_b(b_ptrs, k, offs_k, offs_n, K, N, ok, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr):
    """K step ``k``'s weight tile, masked, all zeros (nothing read) where ``ok`` is false: for
    ``gemm2_preload``, read before the program waits."""
    k_end = tl.where(ok, K, 0)  # the scalar folded into the K bound, not and-ed into the mask
    return tl.load(b_ptrs, mask=_grid_and(offs_k < k_end - k * BLOCK_K, offs_n < N, SWAP_AB), other=0.0)


@triton.jit
def _gemm2_mma(acc, a, b, k, n_first, offs_n, n_ok, slot_safe, expert, h_scale_ptr, w_scale_ptr, stride_hsm,
               stride_hsk, stride_wse, stride_wsn, stride_wsk, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr,
               QUANT: tl.constexpr, EVEN_N: tl.constexpr):
    """acc plus K step ``k`` of one column tile from its loaded operand tiles (``_gemm2_step``)."""
    if QUANT == 2:
        hs = tl.load(h_scale_ptr + slot_safe * stride_hsm + k * stride_hsk)  # [BM]
        ws = w_scale_ptr + expert * stride_wse + k * stride_wsk
        scale = _block_scale(hs, ws, n_first, offs_n, n_ok, stride_wsn, EVEN_N and BLOCK_N <= 128, SWAP_AB)
        return acc + _mma(a, b, tl.zeros_like(acc), SWAP_AB) * scale
    else:
        return _mma(a, b, acc, SWAP_AB)


@triton.jit
def _gemm2_epilogue(acc, slot_safe, row_ok, offs_n, expert, out_ptr, topk_weights_ptr, h_scale_ptr, w_scale_ptr,
                    N, stride_om, stride_hsm, stride_wse, stride_wsn, TOPK: tl.constexpr, BLOCK_N: tl.constexpr,
                    SWAP_AB: tl.constexpr, QUANT: tl.constexpr, ATOMIC_SUM: tl.constexpr):
    """One column tile of GEMM2's output, scaled by the routed weights (and QUANT 1's row and column
    scales), added into each token's row (ATOMIC_SUM) or stored as each slot's row."""
    n_ok = offs_n < N
    routed = tl.load(topk_weights_ptr + slot_safe, mask=row_ok, other=0.0)  # [BLOCK_M]
    if QUANT == 1:
        routed *= tl.load(h_scale_ptr + slot_safe * stride_hsm)
        ws = tl.load(w_scale_ptr + expert * stride_wse + offs_n * stride_wsn, mask=n_ok, other=0.0)
        acc *= _grid_mul(routed, ws, SWAP_AB)
    else:
        acc *= _grid_mul(routed, tl.full((BLOCK_N,), 1.0, tl.float32), SWAP_AB)
    mask = _grid_and(row_ok, n_ok, SWAP_AB)
    if ATOMIC_SUM:
        tok = slot_safe // TOPK
        tl.atomic_add(out_ptr + _grid(tok * stride_om, offs_n, SWAP_AB), acc.to(out_ptr.dtype.element_ty), mask=mask,
                      sem="relaxed")
    else:
        tl.store(out_ptr + _grid(slot_safe * stride_om, offs_n, SWAP_AB), acc.to(out_ptr.dtype.element_ty),
                 mask=mask)


# Columns per program of the top-k sum: 8 rows of 1024 bf16 columns (16 KB) in flight per program.
TOPK_SUM_BLOCK = 1024


@triton.jit
def _topk_sum(rows_ptr, out_ptr, N, stride_r, stride_o, TOPK: tl.constexpr, BLOCK_N: tl.constexpr,
              PDL: tl.constexpr):
    """out[m, cols] = sum over j of rows[m * TOPK + j, cols] in float32, for the stored top-k sum.

    Grid (M, cdiv(N, BLOCK_N)). It replaces ``torch.sum(rows.view(M, topk, N), dim=1)``, whose
    reduction kernel moved 3.1 TB/s at DeepSeek-V3@tp8 M=4096 (173 us) and took 3.3 us at M=1
    on an H200.
    """
    dependent.start(PDL)
    m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(rows_ptr + (m * TOPK + j) * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def _weight_descriptor(w13: torch.Tensor, cfg: TileConfig) -> TensorDescriptor:
    """A TMA descriptor of w13 [E, 2I, hidden] as [E * 2I, hidden], blocks [BLOCK_N, BLOCK_K] (gemm1_tma)."""
    E, two_i, H = w13.shape
    if not tma_rows(H, w13.element_size()):
        raise UserError(f"gemm1_tma: rows of {H} x {w13.element_size()} bytes are not a multiple of 16 (TMA)")
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
    act_scale: torch.Tensor | None = None,  # [2] float32 static input scales of GEMM1 and GEMM2 ("tensor" only)
    compiled: list | None = None,  # if given, the two GEMMs' compiled kernels are appended (ISA inspection)
) -> torch.Tensor:
    """The whole MoE layer from routed tokens to the output, with no host synchronization."""
    M, H = x.shape
    E, two_i, _ = w13.shape
    I = two_i // 2
    topk = topk_ids.shape[1]
    T = M * topk
    assert x.stride(1) == 1 and w13.stride(2) == 1 and w2.stride(2) == 1, "last dims must be contiguous"
    assert topk_weights.is_contiguous() and topk_weights.dtype == torch.float32
    quant = _QUANT[fp8_scheme]
    assert quant != QUANT_BLOCK or config.BLOCK_SIZE_K == 128, "128x128 block scales need BLOCK_SIZE_K = 128"
    assert quant == QUANT_BLOCK or not config.gemm1_quant_x, "gemm1_quant_x is for fp8-block128"
    per_tensor = fp8_scheme == "tensor"
    pdl = config.direct_route and dependent.has_pdl(x.device)
    launch = dict(QUANT=quant, TOPK=topk, **_launch_args(config), **dependent.launch_kwargs(pdl))

    static = act_scale is not None
    assert not static or fp8_scheme == "tensor", "static activation scales are per tensor"
    if config.direct_route:  # a tile per slot: topk_ids serves as the tiles' expert ids, no align launch
        ids = topk_ids.reshape(-1)  # [T]
        sorted_ids, expert_ids, num_padded, max_blocks = ids, ids, ids, T
    else:
        align = moe_align(topk_ids, E, config.BLOCK_SIZE_M)
        sorted_ids, expert_ids, num_padded = align.sorted_ids, align.expert_ids, align.num_padded
        max_blocks = expert_ids.numel()  # the grid's upper bound on tiles along the slots

    act_dtype = x.dtype
    if out is None:
        out = torch.empty(M, H, device=x.device, dtype=act_dtype)
    # GEMM2's top-k sums [M, H], which its atomics add into: float32, then cast to the output; with atomic_out
    # the output itself (bf16 additions, no cast launch). GEMM1's programs zero them (no launch) where they are
    # one contiguous block of at most ZERO_IN_GEMM1_BYTES; else x's 1x128-group quantization launch does, where
    # there is one, each program the tile of the sums at its tile of x; else a launch of their own.
    if config.atomic_out:
        assert out.stride(1) == 1, "atomic_out adds into the output: its rows must be contiguous"
        assert not (interpreting() and out.dtype == torch.bfloat16), "the Triton interpreter has no bf16 atomics"
        acc = out
    else:
        acc = torch.empty(M, H, device=x.device, dtype=torch.float32) if config.atomic_sum else None
    zero = acc is not None and acc.is_contiguous() and acc.numel() * acc.element_size() <= ZERO_IN_GEMM1_BYTES
    x_quant = config.gemm1_quant_x  # GEMM1 quantizes x's 1x128 groups itself: no launch for x
    zero_in_quant = acc is not None and not zero and quant == QUANT_BLOCK and not x_quant
    a1, a1_scale = (x, None) if quant == QUANT_NONE or x_quant else quantize_act(
        x, fp8_scheme, act_scale[:1] if static else None, pdl=pdl, zero=acc if zero_in_quant else None)  # [M, H] fp8
    if acc is not None and not zero and not zero_in_quant:
        acc.zero_()

    # fp8-block128 after a split-K GEMM1: the _swiglu launch writes GEMM2's fp8 input and group scales; without
    # split-K, GEMM1's epilogue does where its tiles are 128 columns wide (a row's group per tile). Static scales
    # without split-K: GEMM1's epilogue writes it.
    split = config.split_k
    group_out = quant == QUANT_BLOCK and split == 1 and config.BLOCK_SIZE_N == 128
    quant_out = (quant == QUANT_BLOCK and split > 1) or group_out
    static_out = static and split == 1
    h = torch.empty(T, I, device=x.device, dtype=w2.dtype if quant_out or static_out else act_dtype)  # [T, I]
    h_scale = torch.empty(T, triton.cdiv(I, 128), device=x.device, dtype=torch.float32) if quant_out else None
    # Split-K: each split's gate|up partial sums, every entry written by GEMM1 (so not zeroed).
    gu = h if split == 1 else torch.empty(split, T, 2 * I, device=x.device, dtype=torch.float32)  # [split, T, 2I]
    stride_split = T * 2 * I
    grid1 = max_blocks * triton.cdiv(I, config.BLOCK_SIZE_N) * split
    # A dynamic per-tensor scale of h: each GEMM1 program writes the maximum of its tile of h, and the quantization
    # launch takes the largest, so no launch reads h for it (with split-K the _swiglu launch writes h, and h's
    # quantization finds its maximum itself).
    amax_out = per_tensor and not static and split == 1
    maxima = torch.empty(grid1, device=x.device, dtype=torch.float32) if amax_out else None  # [grid1]
    k1 = _gemm1_swiglu[(grid1,)](
        a1, w13, gu, act_scale[1:] if static else h_scale, a1_scale, w13_scale, sorted_ids, expert_ids, num_padded,
        T, max_blocks, I, H, a1.stride(0), w13.stride(0), w13.stride(1), gu.stride(-2), stride_split,
        h_scale.stride(0) if group_out else 0, *_scale_strides(a1_scale, 2, per_tensor),
        *_scale_strides(w13_scale, 3), SPLIT_K=split, MERGED=config.gemm1_merged, STATIC_OUT=static_out,
        GROUP_OUT=group_out, ROUND_FIRST=interpreting(), X_QUANT=x_quant, zero_ptr=acc if zero else None,
        zero_numel=acc.numel() if zero else 0, ZERO=zero,
        EVEN_K=H % config.BLOCK_SIZE_K == 0, EVEN_N=I % config.BLOCK_SIZE_N == 0,
        w_desc=_weight_descriptor(w13, config) if config.gemm1_tma else None, TMA_W=config.gemm1_tma,
        amax_ptr=maxima, AMAX_OUT=maxima is not None, **launch,
    )
    if split > 1 and T:
        _swiglu[(T,)](gu, h, h_scale, I, 0 if h_scale is None else h_scale.stride(0), stride_split, SPLIT_K=split,
                      BLOCK_N=min(1024, triton.next_power_of_2(I)), QUANT_OUT=quant_out,
                      BLOCK_G=min(8, triton.next_power_of_2(triton.cdiv(I, 128))), ROUND_FIRST=interpreting(),
                      **dependent.launch_kwargs(pdl))

    if quant_out:
        a2, a2_scale = h, h_scale  # [T, I] fp8, [T, cdiv(I, 128)]
    elif static_out:
        a2, a2_scale = h, act_scale[1:]  # [T, I] fp8, [1]
    else:
        a2, a2_scale = (h, None) if quant == QUANT_NONE else quantize_act(
            h, fp8_scheme, act_scale[1:] if static else None, pdl=pdl, maxima=maxima)  # [T, I] fp8
    if not config.atomic_sum:
        acc = torch.empty(T, H, device=x.device, dtype=act_dtype)  # [T, H], row = slot
    split2 = config.gemm2_split_k
    k2 = _gemm2_combine[(max_blocks * triton.cdiv(H, config.block_n2 * config.gemm2_n_tiles) * split2,)](
        a2, w2, acc, a2_scale, w2_scale, topk_weights, sorted_ids, expert_ids, num_padded,
        T, max_blocks, H, I, a2.stride(0), w2.stride(0), w2.stride(1), acc.stride(0),
        *_scale_strides(a2_scale, 2, per_tensor), *_scale_strides(w2_scale, 3),
        ATOMIC_SUM=config.atomic_sum, N_TILES=config.gemm2_n_tiles, SPLIT_K=split2, EVEN_K=I % config.BLOCK_SIZE_K == 0,
        EVEN_N=H % (config.block_n2 * config.gemm2_n_tiles) == 0, COLUMNS_FIRST=config.gemm2_columns_first,
        PRELOAD=config.gemm2_preload, **{**launch, "BLOCK_N": config.block_n2},
    )
    if config.atomic_sum:
        if not config.atomic_out:
            out.copy_(acc)
    elif M:
        block = min(TOPK_SUM_BLOCK, triton.next_power_of_2(H))
        _topk_sum[(M, triton.cdiv(H, block))](acc, out, H, acc.stride(0), out.stride(0), TOPK=topk, BLOCK_N=block,
                                              **dependent.launch_kwargs(pdl))
    if compiled is not None:
        compiled.extend((k1, k2))
    return out
