"""Routing: top-k expert selection, synthetic routing distributions, and the align step.

Token slot ``s = t * topk + j`` (token ``t`` in [0, M), choice ``j`` in [0, topk)) goes to
expert ``topk_ids[t, j]``; ``T = M * topk`` slots in all. The grouped GEMM kernels work on
tiles of ``block_m`` slots of one expert, so the *align* step lays the slots out grouped by
expert (experts ascending, slots ascending within an expert), each expert's group padded
to a multiple of ``block_m`` with the sentinel ``T``:

- ``sorted_ids`` int32 ``[max_padded_len(T, E, block_m)]``: the slot ids; ``T`` marks padding.
- ``expert_ids`` int32 ``[max_padded_len // block_m]``: the expert of each block of ``block_m``
  entries of ``sorted_ids``.
- ``num_padded`` int32 ``[1]``, on the device: the used length of ``sorted_ids``.

Past ``num_padded`` nothing is defined (consumers stop there; ``moe_align`` leaves it
unwritten, the reference fills ``T`` and ``-1``).

``moe_align`` never synchronizes with the host: output sizes depend on shapes only, and
the token count is a ``do_not_specialize`` argument, so it can be captured in a CUDA graph
and a changing number of tokens never recompiles. Up to ``ONE_PROGRAM_SLOTS`` slots and 32
experts it is one launch of one program (at decode each launch in the layer costs a few
microseconds); otherwise two launches (count, then scatter) with a program per expert and
segment of ``ALIGN_SEGMENT`` slots.
``moe_align_reference`` is plain PyTorch and gives the same tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moebench.errors import UserError

ROUTINGS = ("uniform", "skewed")

# Exponent of the Zipf-like popularity of 'skewed' routing: expert e gets the logit bias
# -ZIPF_EXPONENT * ln(e + 1), i.e. its softmax weight is scaled by 1 / (e + 1) ** ZIPF_EXPONENT.
ZIPF_EXPONENT = 1.0

# Kernel arguments that carry a token count: never specialized, so no recompile when M changes.
TOKEN_COUNT_ARGS = ("num_slots",)

_BLOCK_T = 1024  # slots scanned per loop step
# Slots per segment of the two-launch align: program (expert, segment) scans one segment. With one
# program per expert scanning all slots, the align took 53-58 us of a layer at M=4096, top-8.
ALIGN_SEGMENT = 2048
_BLOCK_B = 256  # expert_ids entries written per loop step
# Up to this many slots and experts the align step is one program over a [128, <=32] one-hot tile.
# On an H200 (graph replay, M=1) it saved 3.3 us of Mixtral's 126 us (E=8), but at E=128/256 its
# [128, 256] tile made the layer 3-10 us slower than the two launches, so wide models keep those.
ONE_PROGRAM_SLOTS = 128
_ONE_PROGRAM_EXPERTS = 32


# ----------------------------------------------------------------------------------------
# Top-k selection and synthetic routing
# ----------------------------------------------------------------------------------------


def topk_softmax(logits: torch.Tensor, topk: int,
                 renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts, then the ``topk`` largest: (weights [M, topk] float32, ids [M, topk] int32).

    With ``renormalize`` the selected weights are rescaled to sum to 1 per token (Mixtral,
    Qwen3, DeepSeek-V3 style). Ids come in descending weight order. No host synchronization.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [M, E], got shape {tuple(logits.shape)}")
    E = logits.shape[1]
    if not 1 <= topk <= E:
        raise UserError(f"topk={topk} must be between 1 and the number of experts ({E})")
    probs = torch.softmax(logits.float(), dim=-1)  # [M, E]
    weights, ids = torch.topk(probs, topk, dim=-1)  # [M, topk], [M, topk]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.contiguous(), ids.to(torch.int32).contiguous()


def zipf_bias(experts: int) -> torch.Tensor:
    """The per-expert logit bias of 'skewed' routing: ``-ZIPF_EXPONENT * ln(e + 1)``, [E] float32.

    Expert 0 is the most popular, then 1, and so on. With topk = 8 the most popular 10% of
    the experts take about half of the slots for E = 64 and almost 90% for E = 256 (about
    10% under 'uniform'); with 2 of 8 experts, the most popular one takes about 36%.
    """
    return -ZIPF_EXPONENT * torch.log(torch.arange(1, experts + 1, dtype=torch.float32))


def route(M: int, experts: int, topk: int, routing: str, seed: int,
          device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic router output for ``M`` tokens: (weights [M, topk] float32, ids [M, topk] int32).

    Logits are i.i.d. N(0, 1) draws from a CPU ``torch.Generator`` seeded with ``seed`` (so
    the same seed gives the same routing on every device), then moved to ``device``:

    - ``uniform``: the logits as drawn; every expert has the same expected load.
    - ``skewed``: the logits plus ``zipf_bias(experts)``, so a few low-numbered experts get
      most of the tokens.
    """
    if routing not in ROUTINGS:
        raise UserError(f"unknown routing {routing!r}; known: {', '.join(ROUTINGS)}")
    if M < 1:
        raise UserError(f"the number of tokens M={M} must be at least 1")
    if not 1 <= topk <= experts:
        raise UserError(f"topk={topk} must be between 1 and the number of experts ({experts})")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    logits = torch.randn(M, experts, generator=gen, dtype=torch.float32)  # [M, E]
    if routing == "skewed":
        logits = logits + zipf_bias(experts)
    return topk_softmax(logits.to(device), topk)


# ----------------------------------------------------------------------------------------
# Align: group slots by expert, pad each group to a multiple of block_m
# ----------------------------------------------------------------------------------------


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


@triton.jit(do_not_specialize=TOKEN_COUNT_ARGS + ("num_segments",))
def _count_kernel(
    ids_ptr,  # [T] int32 or int64: expert of each slot
    counts_ptr,  # [S, E] int32, out: slots per (segment, expert)
    num_slots,  # T = M * topk
    num_segments,  # S = cdiv(T, segment)
    num_experts,  # E
    segment,  # slots per segment
    BLOCK_T: tl.constexpr,
):
    """Grid (E, S): program (e, g) counts the slots of segment g routed to expert e."""
    e = tl.program_id(0)
    g = tl.program_id(1)
    first = g * segment
    end = tl.minimum(first + segment, num_slots)
    offs = tl.arange(0, BLOCK_T)
    acc = tl.zeros([BLOCK_T], dtype=tl.int32)
    for start in range(first, end, BLOCK_T):
        s = start + offs  # [BLOCK_T]
        ids = tl.load(ids_ptr + s, mask=s < end, other=-1)
        acc += (ids == e).to(tl.int32)
    tl.store(counts_ptr + g * num_experts + e, tl.sum(acc, axis=0))


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
    segment,  # slots per segment
    BLOCK_M: tl.constexpr,  # tile height the groups are padded to
    PAD_M: tl.constexpr,  # next power of two >= BLOCK_M
    BLOCK_E: tl.constexpr,  # next power of two >= E
    BLOCK_S: tl.constexpr,  # segments' counts read per loop step
    BLOCK_T: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """Grid (E, S): program (e, g) writes expert e's slots of segment g into e's group of sorted_ids;
    the g = 0 programs also write their group's padding tail and blocks of expert_ids."""
    e = tl.program_id(0)
    g = tl.program_id(1)

    # Slots per expert (all segments), and expert e's slots in the segments before g.
    offs_e = tl.arange(0, BLOCK_E)
    mine = offs_e == e
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    before = tl.zeros([BLOCK_E], dtype=tl.int32)
    for sb in range(0, num_segments, BLOCK_S):
        rows = sb + tl.arange(0, BLOCK_S)  # [BLOCK_S]
        ok = (rows < num_segments)[:, None] & (offs_e < num_experts)[None, :]
        tile = tl.load(counts_ptr + rows[:, None] * num_experts + offs_e[None, :], mask=ok, other=0)
        counts += tl.sum(tile, axis=0)
        before += tl.sum(tl.where((rows < g)[:, None], tile, 0), axis=0)
    # Where expert e's group starts: exclusive prefix sum of the padded counts.
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M  # [BLOCK_E]
    starts = tl.cumsum(padded, axis=0) - padded  # [BLOCK_E]
    start_e = tl.sum(tl.where(mine, starts, 0), axis=0)
    count_e = tl.sum(tl.where(mine, counts, 0), axis=0)
    padded_e = tl.sum(tl.where(mine, padded, 0), axis=0)
    if e == 0 and g == 0:
        tl.store(num_padded_ptr, tl.sum(padded, axis=0))

    # Segment g's slot ids of expert e, in ascending order, after those of earlier segments.
    offs_t = tl.arange(0, BLOCK_T)
    written = tl.sum(tl.where(mine, before, 0), axis=0)
    first = g * segment
    end = tl.minimum(first + segment, num_slots)
    for start in range(first, end, BLOCK_T):
        s = start + offs_t  # [BLOCK_T]
        ids = tl.load(ids_ptr + s, mask=s < end, other=-1)
        hit = (ids == e).to(tl.int32)  # [BLOCK_T]
        pos = start_e + written + tl.cumsum(hit, axis=0) - 1  # [BLOCK_T]
        tl.store(sorted_ids_ptr + pos, s.to(tl.int32), mask=hit != 0)
        written += tl.sum(hit, axis=0)

    if g == 0:
        # The padding tail of the group (fewer than BLOCK_M entries).
        offs_p = tl.arange(0, PAD_M)
        sentinel = tl.zeros([PAD_M], dtype=tl.int32) + num_slots
        tl.store(sorted_ids_ptr + start_e + count_e + offs_p, sentinel, mask=offs_p < padded_e - count_e)

        # The group's blocks of expert_ids.
        offs_b = tl.arange(0, BLOCK_B)
        first_block = start_e // BLOCK_M
        n_blocks = padded_e // BLOCK_M
        expert = tl.zeros([BLOCK_B], dtype=tl.int32) + e
        for b in range(0, n_blocks, BLOCK_B):
            tl.store(expert_ids_ptr + first_block + b + offs_b, expert, mask=b + offs_b < n_blocks)


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
    counts = torch.empty(segments, num_experts, dtype=torch.int32, device=dev)  # [S, E]
    _count_kernel[(num_experts, segments)](ids, counts, T, segments, num_experts, ALIGN_SEGMENT, BLOCK_T=_BLOCK_T)
    _scatter_kernel[(num_experts, segments)](
        ids, counts, out.sorted_ids, out.expert_ids, out.num_padded, T, segments, num_experts, ALIGN_SEGMENT,
        BLOCK_M=block_m, PAD_M=triton.next_power_of_2(block_m), BLOCK_E=triton.next_power_of_2(num_experts),
        BLOCK_S=16, BLOCK_T=_BLOCK_T, BLOCK_B=_BLOCK_B,
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
