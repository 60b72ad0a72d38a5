"""Tests of moebench.kernels.align, the align step.

The Triton kernels and the torch reference are checked against the definition (invariants computed here
from topk_ids alone) and against each other.
"""

from __future__ import annotations

import functools
import inspect
import math

import pytest
import torch
from helpers import declared_do_not_specialize

from moebench import _interpret
from moebench.kernels import align
from moebench.kernels.align import (
    ONE_PROGRAM_SLOTS,
    AlignResult,
    max_padded_len,
    moe_align,
    moe_align_reference,
)

# (M, topk, E, block_m)
ALIGN_CASES = [
    (3, 2, 8, 16),  # T < block_m: the tile is mostly padding
    (1, 1, 4, 16),  # M = 1, topk = 1: a single slot, a single tile
    (1, 8, 64, 16),  # M = 1 decode step of a wide model: 8 experts with one slot each
    (4, 2, 64, 16),  # most experts get no tokens: they must take no space
    (20, 2, 7, 16),  # E not a power of two (counts loaded with a mask)
    (40, 6, 60, 32),  # E not a power of two, 60 experts (Qwen1.5-MoE)
    (10, 8, 8, 16),  # topk == E: every token goes to every expert
    (12, 3, 5, 64),  # M smaller than block_m with a tall tile
    (9, 4, 16, 24),  # block_m not a power of two: the padding tail is masked within a wider range
    (6, 8, 300, 16),  # 300 experts: the prefix sum runs over 512 lanes, most of them masked
    (300, 8, 64, 16),  # large-ish T (2400 slots, several scan chunks), small tiles
    (300, 8, 64, 32),  # the same slots, medium tiles
    (300, 8, 64, 64),  # the same slots, tall tiles
]


def _router_ids(M: int, topk: int, E: int, seed: int = 0, dtype=torch.int32) -> torch.Tensor:
    """Random top-k ids as a router makes them: distinct experts per token, [M, topk]."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(M, E, generator=gen).argsort(dim=-1)[:, :topk].to(dtype)


def _align_on_device(ids: torch.Tensor, E: int, block_m: int, one_program: bool | None = None) -> AlignResult:
    """The Triton align run where kernels run (the GPU if there is one), results brought back to the CPU."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    res = moe_align(ids.to(device), E, block_m, one_program=one_program)
    return AlignResult(res.sorted_ids.cpu(), res.expert_ids.cpu(), res.num_padded.cpu())


@functools.cache
def _aligned(case: tuple[int, int, int, int]) -> tuple[torch.Tensor, AlignResult, AlignResult]:
    """topk_ids of a case, its Triton and its reference alignment (computed once: the interpreter is slow)."""
    M, topk, E, block_m = case
    ids = _router_ids(M, topk, E, seed=sum(case))
    return ids, _align_on_device(ids, E, block_m), moe_align_reference(ids, E, block_m)


def _check_definition(res: AlignResult, topk_ids: torch.Tensor, E: int, block_m: int) -> None:
    """Assert that ``res`` is the alignment of ``topk_ids`` as defined in moebench.kernels.align."""
    T = topk_ids.numel()
    flat = topk_ids.flatten().long()  # [T]
    counts = torch.bincount(flat, minlength=E).tolist()  # [E]
    bound = max_padded_len(T, E, block_m)
    assert res.sorted_ids.shape == (bound,) and res.sorted_ids.dtype == torch.int32
    assert res.expert_ids.shape == (bound // block_m,) and res.expert_ids.dtype == torch.int32
    assert res.num_padded.shape == (1,) and res.num_padded.dtype == torch.int32

    n = int(res.num_padded.item())
    assert n == sum(math.ceil(c / block_m) * block_m for c in counts)
    assert n <= bound and n % block_m == 0
    used = res.sorted_ids[:n].long()  # [n]
    assert ((used >= 0) & (used <= T)).all(), "entries are slot ids or the sentinel T"

    real = used[used < T]
    assert torch.equal(real.sort().values, torch.arange(T)), "every slot appears exactly once"

    blocks = used.view(-1, block_m)  # [n // block_m, block_m]
    block_experts = res.expert_ids[: n // block_m].long()  # [n // block_m]
    for b in range(blocks.shape[0]):
        slots = blocks[b][blocks[b] < T]
        assert (flat[slots] == block_experts[b]).all(), f"block {b} holds a slot of another expert"

    # Groups: experts ascending, each one contiguous, its count of real slots (ascending) then padding.
    pos = 0
    for e in range(E):
        n_blocks = int((block_experts == e).sum())
        assert n_blocks == math.ceil(counts[e] / block_m), f"expert {e} has {n_blocks} blocks"
        if n_blocks == 0:
            continue
        first = pos // block_m
        assert (block_experts[first: first + n_blocks] == e).all(), f"expert {e} is not contiguous"
        group = used[pos: pos + n_blocks * block_m]
        assert torch.equal(group[: counts[e]], torch.nonzero(flat == e).flatten())
        assert (group[counts[e]:] == T).all(), f"expert {e}: padding is not the sentinel T"
        pos += n_blocks * block_m
    assert pos == n


@pytest.mark.parametrize("case", ALIGN_CASES)
def test_moe_align_satisfies_definition(case):
    """The Triton align meets every invariant: each slot once, blocks of one expert, groups padded with T."""
    M, topk, E, block_m = case
    ids, triton_res, _ = _aligned(case)
    _check_definition(triton_res, ids, E, block_m)


@pytest.mark.parametrize("case", ALIGN_CASES)
def test_moe_align_reference_satisfies_definition(case):
    """The torch reference meets the same invariants (so agreement below is agreement with the definition)."""
    M, topk, E, block_m = case
    ids, _, ref = _aligned(case)
    _check_definition(ref, ids, E, block_m)


@pytest.mark.parametrize("case", ALIGN_CASES)
def test_moe_align_matches_reference(case):
    """Triton and reference give identical num_padded and used lengths of sorted_ids and expert_ids."""
    _, got, ref = _aligned(case)
    _assert_same_used(got, ref, case[3])


def _assert_same_used(got: AlignResult, ref: AlignResult, block_m: int) -> None:
    """The defined parts agree: num_padded, and sorted_ids / expert_ids up to it (the rest is unwritten)."""
    n = int(ref.num_padded.item())
    assert torch.equal(got.num_padded, ref.num_padded)
    assert torch.equal(got.sorted_ids[:n], ref.sorted_ids[:n])
    assert torch.equal(got.expert_ids[: n // block_m], ref.expert_ids[: n // block_m])


SMALL_CASES = [c for c in ALIGN_CASES if c[0] * c[1] <= ONE_PROGRAM_SLOTS and c[2] <= 32]


@pytest.mark.parametrize("one_program", [True, False])
@pytest.mark.parametrize("case", SMALL_CASES)
def test_both_align_kernels_on_decode_sized_cases(case, one_program):
    """Where both fit, the one-program align and the two-launch align each meet the definition and agree
    with the reference (by default the first runs these cases, the second the larger ones)."""
    M, topk, E, block_m = case
    ids = _router_ids(M, topk, E, seed=sum(case))
    got = _align_on_device(ids, E, block_m, one_program=one_program)
    _check_definition(got, ids, E, block_m)
    _assert_same_used(got, moe_align_reference(ids, E, block_m), block_m)


@pytest.mark.parametrize("case, segment", [
    ((20, 2, 7, 16), 2),  # 20 segments: more than the scatter reads per step
    ((20, 2, 7, 16), 16),  # 40 slots: two full segments and a short last one
    ((4, 2, 64, 16), 4),  # most experts have no slots in any segment
    ((300, 8, 64, 16), 512),  # 2400 slots: four full segments of many experts each, a short last one
    ((300, 8, 64, 32), 64),  # 38 segments: the counts are read in three steps
])
def test_two_launch_align_over_several_segments(case, segment, monkeypatch):
    """The two-launch align splits the slots into segments (a program per segment sorts its slots by
    expert); any segment length gives the definition's result, slots ascending across segment boundaries."""
    monkeypatch.setattr(align, "ALIGN_SEGMENT", segment)
    M, topk, E, block_m = case
    ids = _router_ids(M, topk, E, seed=sum(case))
    got = _align_on_device(ids, E, block_m, one_program=False)
    _check_definition(got, ids, E, block_m)
    _assert_same_used(got, moe_align_reference(ids, E, block_m), block_m)


@pytest.mark.parametrize("one_program", [True, False])
def test_moe_align_drops_ids_outside_the_experts(one_program):
    """A slot whose id is not in [0, E) is in no group: both kernels agree with the reference, which
    groups only the slots of experts 0..E-1."""
    ids = _router_ids(12, 2, 6, seed=5)  # [M, topk]
    ids[0, 0], ids[3, 1], ids[7, 0] = -1, 6, 1000
    got, ref = _align_on_device(ids, 6, 16, one_program=one_program), moe_align_reference(ids, 6, 16)
    n = int(ref.num_padded.item())
    assert n == 16 * sum(math.ceil(int((ids == e).sum()) / 16) for e in range(6))
    assert not torch.isin(torch.tensor([0, 7, 14]), ref.sorted_ids[:n]).any()  # the three slots dropped
    _assert_same_used(got, ref, 16)


def test_one_program_align_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="one-program align"):
        moe_align(torch.zeros(ONE_PROGRAM_SLOTS + 1, 1, dtype=torch.int32), 4, 16, one_program=True)


def test_moe_align_worked_example():
    """A small case written out by hand: slots 0..3 go to experts 2, 0, 2, 1; expert 3 gets none."""
    ids = torch.tensor([[2, 0], [2, 1]], dtype=torch.int32)  # [M=2, topk=2]
    T = 4  # the sentinel; block_m = 4, max_padded_len(4, 4, 4) = 16
    for fn in (_align_on_device, moe_align_reference):
        res = fn(ids, 4, 4)
        assert res.num_padded.tolist() == [12]
        #                                     expert 0    | expert 1    | expert 2    | (unused: 4 more)
        assert res.sorted_ids[:12].tolist() == [1, T, T, T, 3, T, T, T, 0, 2, T, T]
        assert res.expert_ids[:3].tolist() == [0, 1, 2]
        assert res.sorted_ids.shape == (16,) and res.expert_ids.shape == (4,)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_moe_align_accepts_int32_and_int64_ids(dtype):
    """Router ids come as int32 (ours) or int64 (torch.topk): both give the reference result."""
    ids = _router_ids(25, 3, 12, seed=3, dtype=dtype)
    got, ref = _align_on_device(ids, 12, 16), moe_align_reference(ids, 12, 16)
    _check_definition(got, ids, 12, 16)
    _assert_same_used(got, ref, 16)


def test_moe_align_all_slots_to_one_expert():
    """The most skewed load: every slot on one expert, so one long group of many blocks."""
    ids = torch.full((700, 1), 5, dtype=torch.int32)  # [M, topk]: 700 slots -> 44 blocks of 16
    got = _align_on_device(ids, 9, 16)
    _check_definition(got, ids, 9, 16)
    assert got.num_padded.item() == 704
    _assert_same_used(got, moe_align_reference(ids, 9, 16), 16)


@pytest.mark.parametrize("T,E,block_m,expected", [
    (4, 4, 4, 16),  # every slot on its own expert: 4 groups of one slot padded to 4
    (3, 8, 16, 48),  # fewer slots than experts: at most T groups
    (2400, 64, 16, 3360),  # prefill: 2400 + 64 * 15 = 3360, already a multiple of 16
    (10, 3, 8, 32),  # 10 + 3 * 7 = 31, rounded up to a multiple of 8
])
def test_max_padded_len(T, E, block_m, expected):
    """The host-side bound follows T + min(T, E) * (block_m - 1), rounded up to block_m."""
    assert max_padded_len(T, E, block_m) == expected


def test_moe_align_rejects_bad_ids():
    """Ids that are not an integer [M, topk] tensor are a programming error."""
    with pytest.raises(ValueError):
        moe_align(torch.zeros(4, 2), 8, 16)
    with pytest.raises(ValueError):
        moe_align(torch.zeros(8, dtype=torch.int32), 8, 16)




# ----------------------------------------------------------------------------------------
# no recompilation when the token count changes
# ----------------------------------------------------------------------------------------

_ALIGN_KERNELS = (align._count_kernel, align._scatter_kernel, align._align_one_program)


@pytest.mark.parametrize("kernel", _ALIGN_KERNELS, ids=lambda k: k.fn.__name__)
def test_align_kernels_do_not_specialize_token_count(kernel):
    """Every align kernel declares the token count do_not_specialize (and names only real parameters)."""
    params = list(inspect.signature(kernel.fn).parameters)
    declared = declared_do_not_specialize(kernel)
    assert "num_slots" in params and "num_slots" in declared
    # Triton silently ignores a misspelled name, so check that each declared name is a parameter.
    assert all(name in params or isinstance(name, int) for name in declared)


def _compiled_variants(kernel) -> int:
    # device_caches[device][0] is the kernel cache in triton 3.6 through 3.9.
    return sum(len(caches[0]) for caches in kernel.device_caches.values())


def _integer_class(v: int) -> str:
    """The class Triton specializes an int argument by when it may: ==1, divisible by 16, or other."""
    return "one" if v == 1 else "div16" if v % 16 == 0 else "other"


class _Recorded:
    """Stands in for a kernel in ``moebench.kernels.align``: launches it and records each launch's token count."""

    def __init__(self, kernel):
        self.kernel, self.num_slots = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.num_slots.append(inspect.signature(self.kernel.fn).bind_partial(*args).arguments["num_slots"])
            return self.kernel[grid](*args, **kwargs)
        return launch


# (M, one_program) at top-1 of 8 experts, so T = M: the one-program align runs T <= ONE_PROGRAM_SLOTS by
# default, the count and scatter launches the rest, and one_program=False sends small T to them too.
_FIRST = [(1, None), (1, False)]  # T == 1 through each kernel: every kernel compiles here
_THEN = [
    (5, None), (16, None), (33, None), (128, None),  # one program: other, %16, other, %16 (its largest T)
    (5, False), (16, False),  # count and scatter at decode sizes: other, %16 (one segment)
    (129, None), (144, None), (1000, None),  # count and scatter: other, %16 (one segment), other (4 segments)
]


@pytest.mark.skipif(_interpret.interpreting() or not torch.cuda.is_available(),
                    reason="the Triton interpreter compiles nothing; checked on the GPU")
def test_moe_align_does_not_recompile_when_M_changes(monkeypatch):
    """Each of the three align kernels sees token counts of Triton's three integer classes (==1, %16, other),
    from one segment to several: it compiles once, at the first of them, and never again."""
    E, block_m = 8, 16
    recorded = {k.fn.__name__: _Recorded(k) for k in _ALIGN_KERNELS}
    for name, stand_in in recorded.items():
        monkeypatch.setattr(align, name, stand_in)

    for M, one_program in _FIRST:
        moe_align(_router_ids(M, 1, E).cuda(), E, block_m, one_program=one_program)
    torch.cuda.synchronize()
    before = [_compiled_variants(k) for k in _ALIGN_KERNELS]
    assert all(n >= 1 for n in before), f"a kernel compiled nothing: {before}"
    for M, one_program in _THEN:
        moe_align(_router_ids(M, 1, E).cuda(), E, block_m, one_program=one_program)
    torch.cuda.synchronize()
    for name, stand_in in recorded.items():  # the precondition: each kernel saw each class
        assert {_integer_class(t) for t in stand_in.num_slots} == {"one", "div16", "other"}, (name, stand_in.num_slots)
    assert [_compiled_variants(k) for k in _ALIGN_KERNELS] == before
