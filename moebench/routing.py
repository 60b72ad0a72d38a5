"""The synthetic router: top-k expert selection and the routing distributions benchmarks draw from.

``route`` draws router logits from a seed, ``topk_softmax`` turns them into the routed weights and expert
ids ``[M, topk]`` the layer takes; token ``t``'s choice ``j`` is slot ``s = t * topk + j``. Grouping the
slots by expert for the GEMMs is the align step, ``moebench.kernels.align``.
"""

from __future__ import annotations

import torch

from moebench.errors import UserError

ROUTINGS = ("uniform", "skewed")

# Exponent of the Zipf-like popularity of 'skewed' routing: expert e gets the logit bias
# -ZIPF_EXPONENT * ln(e + 1), i.e. its softmax weight is scaled by 1 / (e + 1) ** ZIPF_EXPONENT.
ZIPF_EXPONENT = 1.0


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
