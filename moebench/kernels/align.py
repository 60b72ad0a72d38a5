"""The align step: token slots grouped by expert, each group padded to the tile height.

Slot ``s = t * topk + j`` goes to expert ``topk_ids[t, j]``; ``T = M * topk`` slots in all. The grouped
GEMMs work on tiles of ``block_m`` slots of one expert, so the slots are laid out by expert (experts
ascending, slots ascending within an expert), each group padded to a multiple of ``block_m`` with the
sentinel ``T``:

- ``sorted_ids`` int32 ``[max_padded_len(T, E, block_m)]``: the slot ids; ``T`` marks padding.
- ``expert_ids`` int32 ``[max_padded_len // block_m]``: the expert of each block of ``block_m`` entries.
- ``num_padded`` int32 ``[1]``, on the device: the used length of ``sorted_ids``.

Past ``num_padded`` nothing is defined (consumers stop there; ``moe_align`` leaves it unwritten, the
reference fills ``T`` and ``-1``). ``moe_align`` never synchronizes with the host: output sizes depend on
shapes only and the token count is ``do_not_specialize``, so it is graph-capturable and a changing number
of tokens never recompiles. Up to ``ONE_PROGRAM_SLOTS`` slots and 32 experts it is one launch of one
program (each launch costs a few microseconds at decode); otherwise two launches (count, then scatter),
a program per segment of ``ALIGN_SEGMENT`` slots, the scatter sorting its segment by (expert, slot).
``moe_align_reference`` is plain PyTorch and gives the same tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moebench.errors import UserError

# Kernel arguments that carry a token count: never specialized, so no recompile when M changes.
TOKEN_COUNT_ARGS = ("num_slots",)

# Slots per segment of the two-launch align (a power of two): a program per segment counts its slots
# per expert, then sorts them by expert, so the work grows with T, not with E * T.
ALIGN_SEGMENT = 256
_BLOCK_S = 16  # segments' counts read per loop step
# Up to this many slots and experts the align step is one program over a [128, <=32] one-hot tile; with
# many experts the tile grows as wide as E and the two launches are faster.
ONE_PROGRAM_SLOTS = 128
_ONE_PROGRAM_EXPERTS = 32


@dataclass(frozen=True)
class AlignResult:
    """Only the first ``num_padded`` entries of ``sorted_ids`` (and their blocks of ``expert_ids``) are
    defined: the kernels never read past them, so ``moe_align`` does not spend launches filling the
    rest (the reference fills it with T and -1)."""

    sorted_ids: torch.Tensor  # [max_padded_len] int32: slot ids grouped by expert; T marks padding
    expert_ids: torch.Tensor  # [max_padded_len // block_m] int32: expert of each block
    num_padded: torch.Tensor  # [1] int32: used length of sorted_ids (a multiple of block_m)


def max_padded_len(T: int, E: int, block_m: int) -> int:
    """Upper bound on ``num_padded`` from shapes only.

    T slots in at most min(T, E) groups, each padded by fewer than ``block_m`` entries,
    rounded up to a whole number of blocks: ``max_blocks = max_padded_len // block_m``.
    """
    bound = T + min(T, E) * (block_m - 1)
    return -(-bound // block_m) * block_m


def _check_align_args(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> None:
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be an int32 or int64 [M, topk] tensor, got {topk_ids.dtype} "
                         f"of shape {tuple(topk_ids.shape)}")
    if num_experts < 1:
        raise UserError(f"the number of experts ({num_experts}) must be at least 1")
    if block_m < 1:
        raise UserError(f"block_m={block_m} must be at least 1")


def _empty_result(T: int, num_experts: int, block_m: int, device: torch.device) -> AlignResult:
    n = max_padded_len(T, num_experts, block_m)
    return AlignResult(
        sorted_ids=torch.full((n,), T, dtype=torch.int32, device=device),  # [max_padded_len]
        expert_ids=torch.full((n // block_m,), -1, dtype=torch.int32, device=device),  # [max_blocks]
        num_padded=torch.zeros(1, dtype=torch.int32, device=device),  # [1]
    )


@triton.jit
def _compare_exchange(x, N: tl.constexpr, STAGE: tl.constexpr, S: tl.constexpr):
    """One step of the bitonic network: x[i] and x[i + S] ordered, ascending or descending by run."""
    R: tl.constexpr = N // (2 * S)
    a, b = tl.split(tl.permute(tl.reshape(x, (R, 2, S)), (0, 2, 1)))  # [R, S] each
    down = ((tl.arange(0, R) * (2 * S)) & (1 << STAGE)) != 0  # [R]: pairs in a descending run
    lo, hi = tl.minimum(a, b), tl.maximum(a, b)
    pair = tl.join(tl.where(down[:, None], hi, lo), tl.where(down[:, None], lo, hi))  # [R, S, 2]
    return tl.reshape(tl.permute(pair, (0, 2, 1)), (N,))


@triton.jit
def _bitonic_sort(x, N: tl.constexpr, LOG_N: tl.constexpr):
    """x [N] in ascending order, N = 2 ** LOG_N: a bitonic network, each compare-exchange step written
    as reshape, split and join. ``tl.sort`` is no faster on the GPU, and its xor-reduction form is far
    slower under the Triton interpreter, where the CPU tests run it."""
    for stage in tl.static_range(1, LOG_N + 1):  # merge sorted runs of 2**(stage-1) into runs of 2**stage
        for sub in tl.static_range(stage):
            x = _compare_exchange(x, N, stage, 1 << (stage - 1 - sub))
    return x


@triton.jit
def _segment_experts(ids_ptr, g, num_slots, num_experts, SEGMENT: tl.constexpr):
    """Slot ids [SEGMENT] of segment ``g`` and their experts [SEGMENT] int32, with ``num_experts`` (a bin
    no expert uses) for slots past the end and for ids outside [0, num_experts)."""
    slots = g * SEGMENT + tl.arange(0, SEGMENT)
    ids = tl.load(ids_ptr + slots, mask=slots < num_slots, other=-1)
    ok = (ids >= 0) & (ids < num_experts)
    return slots, tl.where(ok, ids, num_experts).to(tl.int32)


@triton.jit(do_not_specialize=TOKEN_COUNT_ARGS)
def _count_kernel(
    ids_ptr,  # [T] int32 or int64: expert of each slot
    counts_ptr,  # [S, E] int32, out: slots per (segment, expert)
    num_slots,  # T = M * topk
    num_experts,  # E
    SEGMENT: tl.constexpr,  # slots per segment
    BLOCK_E: tl.constexpr,  # next power of two > E (bin E holds the slots of no expert)
):
    """Grid (S,): program g counts the slots of segment g per expert."""
    g = tl.program_id(0)
    _, experts = _segment_experts(ids_ptr, g, num_slots, num_experts, SEGMENT)
    counts = tl.histogram(experts, BLOCK_E)  # [BLOCK_E]
    offs_e = tl.arange(0, BLOCK_E)
    tl.store(counts_ptr + g * num_experts + offs_e, counts, mask=offs_e < num_experts)


@triton.jit(do_not_specialize=TOKEN_COUNT_ARGS + ("num_segments",))
def _scatter_kernel(
    ids_ptr,  # [T] int32 or int64: expert of each slot
    counts_ptr,  # [S, E] int32: slots per (segment, expert), from _count_kernel
    sorted_ids_ptr,  # [max_padded_len] int32, out
    expert_ids_ptr,  # [max_blocks] int32, out
    num_padded_ptr,  # [1] int32, out
    num_slots,  # T = M * topk, also the padding sentinel
    num_segments,  # S
    num_experts,  # E
    BLOCK_M: tl.constexpr,  # tile height the groups are padded to
    PAD_M: tl.constexpr,  # next power of two >= BLOCK_M
    SEGMENT: tl.constexpr,
    LOG_SEGMENT: tl.constexpr,
    BLOCK_E: tl.constexpr,  # next power of two > E
    BLOCK_S: tl.constexpr,  # segments' counts read per loop step
    BLOCK_C: tl.constexpr,  # experts whose padding tails one step writes (a power of two <= BLOCK_E)
):
    """Grid (S,): program g writes segment g's slots into their experts' groups of sorted_ids, the
    expert_ids of the blocks they start, and the padding tails of experts g * BLOCK_C... (every S-th chunk)."""
    g = tl.program_id(0)

    # Slots per expert (all segments), each expert's slots in the segments before g, and in segment g.
    offs_e = tl.arange(0, BLOCK_E)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    before = tl.zeros([BLOCK_E], dtype=tl.int32)
    in_segment = tl.zeros([BLOCK_E], dtype=tl.int32)
    for sb in range(0, num_segments, BLOCK_S):
        rows = sb + tl.arange(0, BLOCK_S)  # [BLOCK_S]
        ok = (rows < num_segments)[:, None] & (offs_e < num_experts)[None, :]
        tile = tl.load(counts_ptr + rows[:, None] * num_experts + offs_e[None, :], mask=ok, other=0)
        counts += tl.sum(tile, axis=0)
        before += tl.sum(tl.where((rows < g)[:, None], tile, 0), axis=0)
        in_segment += tl.sum(tl.where((rows == g)[:, None], tile, 0), axis=0)
    # Where each expert's group starts: exclusive prefix sum of the padded counts.
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M  # [BLOCK_E]
    starts = tl.cumsum(padded, axis=0) - padded  # [BLOCK_E]
    if g == 0:
        tl.store(num_padded_ptr, tl.sum(padded, axis=0))

    # The segment sorted by (expert, slot): the slot at sorted position p is the (p - first[e])-th of
    # its expert e in the segment, where first[e] counts the segment's slots of lower experts, so it
    # goes to e's group start plus the slots of e in earlier segments plus that rank.
    # (Slots of no expert, bin E, sort last and are not stored, so their count is not needed.)
    slots, experts = _segment_experts(ids_ptr, g, num_slots, num_experts, SEGMENT)
    first = tl.cumsum(in_segment, axis=0) - in_segment  # [BLOCK_E]
    keys = _bitonic_sort(experts * SEGMENT + (slots - g * SEGMENT), SEGMENT, LOG_SEGMENT)  # [SEGMENT]
    expert = keys // SEGMENT
    pos = tl.gather(starts + before - first, expert, 0) + tl.arange(0, SEGMENT)  # [SEGMENT]
    real = expert < num_experts
    tl.store(sorted_ids_ptr + pos, g * SEGMENT + keys % SEGMENT, mask=real)
    # A group pads with fewer than BLOCK_M entries, so every block starts with a real slot: that slot's
    # program writes the block's expert.
    tl.store(expert_ids_ptr + pos // BLOCK_M, expert, mask=real & (pos % BLOCK_M == 0))

    # The padding tails (fewer than BLOCK_M entries each) of experts [e0, e0 + BLOCK_C), e0 = g * BLOCK_C,
    # (g + S) * BLOCK_C, ...
    offs_p = tl.arange(0, PAD_M)
    for e0 in range(g * BLOCK_C, num_experts, num_segments * BLOCK_C):
        chunk = e0 + tl.arange(0, BLOCK_C)  # [BLOCK_C], within BLOCK_E
        used = tl.gather(starts, chunk, 0) + tl.gather(counts, chunk, 0)  # [BLOCK_C] where the tail starts
        tail = tl.gather(padded - counts, chunk, 0)  # [BLOCK_C]
        ok = (chunk < num_experts)[:, None] & (offs_p[None, :] < tail[:, None])
        tl.store(sorted_ids_ptr + used[:, None] + offs_p[None, :], tl.zeros([BLOCK_C, PAD_M], tl.int32) + num_slots,
                 mask=ok)


@triton.jit(do_not_specialize=TOKEN_COUNT_ARGS)
def _align_one_program(
    ids_ptr,  # [T] int32 or int64: expert of each slot
    sorted_ids_ptr,  # [max_padded_len] int32, out
    expert_ids_ptr,  # [max_blocks] int32, out
    num_padded_ptr,  # [1] int32, out
    num_slots,  # T <= BLOCK_T, also the padding sentinel
    num_experts,  # E <= BLOCK_E
    BLOCK_M: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """Grid (1,): the whole align step for at most BLOCK_T slots, from one [BLOCK_T, BLOCK_E] one-hot tile."""
    offs_t = tl.arange(0, BLOCK_T)
    offs_e = tl.arange(0, BLOCK_E)
    ids = tl.load(ids_ptr + offs_t, mask=offs_t < num_slots, other=-1)  # [BLOCK_T]
    hit = ((ids[:, None] == offs_e[None, :]) & (offs_e < num_experts)[None, :]).to(tl.int32)  # [BLOCK_T, BLOCK_E]
    counts = tl.sum(hit, axis=0)  # [BLOCK_E]
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)  # [BLOCK_E]: where each expert's group ends
    total = tl.sum(padded, axis=0)
    tl.store(num_padded_ptr, total)

    # Every used entry gets the sentinel; the real slots overwrite theirs after the barrier.
    for p in range(0, total, BLOCK_T):
        offs_p = p + offs_t
        tl.store(sorted_ids_ptr + offs_p, tl.zeros([BLOCK_T], dtype=tl.int32) + num_slots, mask=offs_p < total)
    # A block's expert: the number of experts whose group ends at or before the block starts.
    n_blocks = total // BLOCK_M
    for b in range(0, n_blocks, BLOCK_B):
        offs_b = b + tl.arange(0, BLOCK_B)  # [BLOCK_B]
        before = (ends[None, :] <= (offs_b * BLOCK_M)[:, None]).to(tl.int32)  # [BLOCK_B, BLOCK_E]
        tl.store(expert_ids_ptr + offs_b, tl.sum(before, axis=1), mask=offs_b < n_blocks)
    tl.debug_barrier()

    # Slot s of expert e goes to e's group start plus its rank among e's slots (slots ascending).
    rank = tl.cumsum(hit, axis=0) - 1 + (ends - padded)[None, :]  # [BLOCK_T, BLOCK_E]
    pos = tl.sum(hit * rank, axis=1)  # [BLOCK_T]
    tl.store(sorted_ids_ptr + pos, offs_t, mask=tl.sum(hit, axis=1) != 0)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int, one_program: bool | None = None) -> AlignResult:
    """Group the slots of ``topk_ids`` [M, topk] by expert, padded to ``block_m``; no host sync.

    Ids must lie in [0, num_experts); a slot with an id outside that range is dropped.
    ``one_program`` forces (True) or refuses (False) the single-program kernel; None picks it
    where it fits (tests use the flag to run both on the same cases).
    """
    _check_align_args(topk_ids, num_experts, block_m)
    T = topk_ids.numel()
    if T == 0:
        return _empty_result(T, num_experts, block_m, topk_ids.device)
    n, dev = max_padded_len(T, num_experts, block_m), topk_ids.device
    out = AlignResult(  # the align kernels write every entry the GEMMs read
        sorted_ids=torch.empty(n, dtype=torch.int32, device=dev),  # [max_padded_len]
        expert_ids=torch.empty(n // block_m, dtype=torch.int32, device=dev),  # [max_blocks]
        num_padded=torch.empty(1, dtype=torch.int32, device=dev),  # [1]
    )
    ids = topk_ids.contiguous().view(-1)  # [T]
    fits = T <= ONE_PROGRAM_SLOTS and num_experts <= _ONE_PROGRAM_EXPERTS
    if one_program or (one_program is None and fits):
        if not fits:
            raise ValueError(f"the one-program align takes up to {ONE_PROGRAM_SLOTS} slots and "
                             f"{_ONE_PROGRAM_EXPERTS} experts, got {T} and {num_experts}")
        _align_one_program[(1,)](
            ids, out.sorted_ids, out.expert_ids, out.num_padded, T, num_experts, BLOCK_M=block_m,
            BLOCK_T=ONE_PROGRAM_SLOTS, BLOCK_E=triton.next_power_of_2(num_experts), BLOCK_B=64, num_warps=8,
        )
        return out
    segments = triton.cdiv(T, ALIGN_SEGMENT)
    block_e = triton.next_power_of_2(num_experts + 1)
    counts = torch.empty(segments, num_experts, dtype=torch.int32, device=dev)  # [S, E]
    _count_kernel[(segments,)](ids, counts, T, num_experts, SEGMENT=ALIGN_SEGMENT, BLOCK_E=block_e)
    _scatter_kernel[(segments,)](
        ids, counts, out.sorted_ids, out.expert_ids, out.num_padded, T, segments, num_experts, BLOCK_M=block_m,
        PAD_M=triton.next_power_of_2(block_m), SEGMENT=ALIGN_SEGMENT,
        LOG_SEGMENT=ALIGN_SEGMENT.bit_length() - 1, BLOCK_E=block_e, BLOCK_S=_BLOCK_S,
        BLOCK_C=min(64, block_e),
    )
    return out


def moe_align_reference(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignResult:
    """Plain-PyTorch ``moe_align``: the same tensors, built one expert at a time (synchronizes the host)."""
    _check_align_args(topk_ids, num_experts, block_m)
    T = topk_ids.numel()
    out = _empty_result(T, num_experts, block_m, topk_ids.device)
    flat = topk_ids.reshape(-1)  # [T]
    pos = 0
    for e in range(num_experts):
        slots = torch.nonzero(flat == e).flatten()  # [count_e], ascending
        count = slots.numel()
        if count == 0:
            continue
        padded = math.ceil(count / block_m) * block_m
        out.sorted_ids[pos:pos + count] = slots.to(torch.int32)
        out.expert_ids[pos // block_m:(pos + padded) // block_m] = e
        pos += padded
    out.num_padded.fill_(pos)
    return out

