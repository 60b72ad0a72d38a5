"""Tests of moebench.routing: top-k selection and the synthetic routing distributions."""

from __future__ import annotations

import pytest
import torch

from moebench.errors import UserError
from moebench.routing import ROUTINGS, route, topk_softmax

# ----------------------------------------------------------------------------------------
# topk_softmax
# ----------------------------------------------------------------------------------------

SOFTMAX_CASES = [
    (1, 8, 2),  # one token (decode), Mixtral-like 2 of 8
    (37, 64, 8),  # odd token count, 8 of 64
    (16, 60, 4),  # E not a power of two
    (5, 6, 6),  # topk == E: every expert selected, weights are the full softmax
]


def _logits(M: int, E: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(M, E, generator=gen) * 3  # [M, E]; continuous draws, so no ties


@pytest.mark.parametrize("M,E,topk", SOFTMAX_CASES)
def test_topk_softmax_matches_reference(M, E, topk):
    """Weights sum to 1, ids are the true top-k of the logits, and both match a torch reference."""
    logits = _logits(M, E)
    weights, ids = topk_softmax(logits, topk)
    assert weights.shape == ids.shape == (M, topk)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32

    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(M))
    # The top-k of the softmax are the top-k of the logits (softmax is monotonic).
    true_ids = torch.argsort(logits, dim=-1, descending=True)[:, :topk]  # [M, topk]
    assert torch.equal(ids.long(), true_ids)

    # Reference: full softmax in float64, gather the chosen experts, renormalize.
    probs = torch.softmax(logits.double(), dim=-1)  # [M, E]
    chosen = probs.gather(1, true_ids)  # [M, topk]
    torch.testing.assert_close(weights.double(), chosen / chosen.sum(dim=-1, keepdim=True))


def test_topk_softmax_without_renormalize_keeps_softmax_weights():
    """renormalize=False returns the softmax probabilities of the chosen experts unchanged."""
    logits = _logits(9, 16)
    weights, ids = topk_softmax(logits, 3, renormalize=False)
    probs = torch.softmax(logits, dim=-1)  # [M, E]
    torch.testing.assert_close(weights, probs.gather(1, ids.long()))
    assert (weights.sum(dim=-1) < 1).all()


def test_topk_softmax_rejects_topk_above_experts():
    """A topk larger than the number of experts is a user error with one line."""
    with pytest.raises(UserError, match="topk=9"):
        topk_softmax(_logits(2, 8), 9)


# ----------------------------------------------------------------------------------------
# route
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("routing_name", ROUTINGS)
def test_route_is_deterministic_and_valid(routing_name):
    """Same seed -> same routing; another seed -> another; ids distinct per token and in range."""
    M, E, topk = 50, 32, 4
    w1, ids1 = route(M, E, topk, routing_name, seed=7, device="cpu")
    w2, ids2 = route(M, E, topk, routing_name, seed=7, device="cpu")
    w3, ids3 = route(M, E, topk, routing_name, seed=8, device="cpu")
    assert torch.equal(w1, w2) and torch.equal(ids1, ids2)
    assert not torch.equal(ids1, ids3)

    assert ids1.shape == w1.shape == (M, topk)
    assert ids1.dtype == torch.int32 and w1.dtype == torch.float32
    assert ((ids1 >= 0) & (ids1 < E)).all()
    assert all(len(set(row)) == topk for row in ids1.tolist())
    torch.testing.assert_close(w1.sum(dim=-1), torch.ones(M))


def _top_decile_share(ids: torch.Tensor, E: int) -> float:
    load = torch.bincount(ids.flatten().long(), minlength=E).float()  # [E]
    top = max(1, E // 10)
    return (load.sort(descending=True).values[:top].sum() / load.sum()).item()


def test_skewed_routing_concentrates_load():
    """Under 'skewed' the busiest 10% of experts get a clearly larger share than under 'uniform'."""
    M, E, topk = 2000, 64, 8
    _, uniform = route(M, E, topk, "uniform", seed=0, device="cpu")
    _, skewed = route(M, E, topk, "skewed", seed=0, device="cpu")
    share_uniform = _top_decile_share(uniform, E)
    share_skewed = _top_decile_share(skewed, E)
    assert share_uniform < 0.15  # balanced: about 6/64 of the slots
    assert share_skewed > 0.35 and share_skewed > 3 * share_uniform
    # The popular experts are the low-numbered ones (the bias decreases with the expert id).
    load = torch.bincount(skewed.flatten().long(), minlength=E)  # [E]
    assert load[:6].sum() > 5 * load[-6:].sum()


def test_route_rejects_unknown_routing():
    """An unknown routing name is a UserError that lists the known ones."""
    with pytest.raises(UserError) as info:
        route(4, 8, 2, "zipf", seed=0, device="cpu")
    assert all(name in str(info.value) for name in ROUTINGS)
    assert "\n" not in str(info.value)
