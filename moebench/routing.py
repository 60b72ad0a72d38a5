"""The synthetic router: top-k expert selection and the routing distributions benchmarks draw from.

``route`` draws router logits from a seed, ``topk_softmax`` turns them into the routed weights and expert
ids ``[M, topk]`` the layer takes; token ``t``'s choice ``j`` is slot ``s = t * topk + j``. Grouping the
slots by expert for the GEMMs is the align step, ``moebench.kernels.align``.

Besides the synthetic distributions, a routing can be captured from a served model: a file of top-k expert
ids, one row per token (``captured``), named in a routing as ``file:<path>#<digest>`` (the digest of its
contents, so a request names what it was tuned under). ``route`` then draws M of its rows, seeded.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import torch

from moebench.bounded import Refused, check_regular, read_bytes
from moebench.errors import UserError

ROUTINGS = ("uniform", "skewed")
CAPTURED = "file:"  # the prefix of a captured routing: file:<path>#<digest>

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
    check_routing(routing)
    if M < 1:
        raise UserError(f"the number of tokens M={M} must be at least 1")
    if not 1 <= topk <= experts:
        raise UserError(f"topk={topk} must be between 1 and the number of experts ({experts})")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if routing.startswith(CAPTURED):
        rows = _captured_rows(routing)  # [N, topk] int32
        picked = rows[torch.randint(rows.shape[0], (M,), generator=gen)]  # [M, topk]
        weights = torch.softmax(torch.randn(M, topk, generator=gen), dim=-1).sort(dim=-1, descending=True).values
        return weights.to(device).contiguous(), picked.to(device).contiguous()
    logits = torch.randn(M, experts, generator=gen, dtype=torch.float32)  # [M, E]
    if routing == "skewed":
        logits = logits + zipf_bias(experts)
    return topk_softmax(logits.to(device), topk)


def with_shared(weights: torch.Tensor, ids: torch.Tensor, first: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's output with ``n`` shared experts (ids ``first`` .. ``first + n - 1``) appended to every
    token's choices at weight 1, as a layer serving its shared experts among the routed ones runs them:
    (weights [M, topk + n] float32, ids [M, topk + n] int32)."""
    M = ids.shape[0]
    shared = torch.arange(first, first + n, dtype=ids.dtype, device=ids.device).expand(M, n)  # [M, n]
    ones = torch.ones(M, n, dtype=weights.dtype, device=weights.device)
    return torch.cat([weights, ones], dim=1).contiguous(), torch.cat([ids, shared], dim=1).contiguous()


def check_routing(routing: str) -> None:
    """UserError unless ``routing`` is a synthetic distribution's name or a captured routing (``captured``)."""
    if routing not in ROUTINGS and not (isinstance(routing, str) and routing.startswith(CAPTURED) and "#" in routing):
        raise UserError(f"unknown routing {routing!r}; known: {', '.join(ROUTINGS)}, or a file of top-k ids")


ROUTING_BYTES = 1 << 30  # a captured routing file: a million tokens' top-8 ids as int32 take 32 MB


def load_ids(path: Path | str) -> torch.Tensor:
    """The top-k expert ids of a captured routing file, [N, topk] int32: a ``.pt`` tensor or a ``.npy`` array of
    integers, one row per token. UserError (one line) for anything else."""
    path = Path(path)
    if path.suffix not in (".npy", ".pt"):
        raise UserError(f"routing file {path}: expected a .pt or .npy file of top-k expert ids")
    try:
        check_regular(path)  # a FIFO would block the loader
    except Refused as e:
        raise UserError(f"routing file {path}: cannot be read ({e.why})") from None
    try:
        if path.suffix == ".npy":
            import numpy as np

            ids = torch.from_numpy(np.load(path, allow_pickle=False))
        else:
            ids = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a missing, unreadable or foreign file, whatever the loader raises
        raise UserError(f"routing file {path}: cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.numel() == 0:
        what = f"shape {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise UserError(f"routing file {path}: expected top-k ids [tokens, topk], got {what}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise UserError(f"routing file {path}: expected integer expert ids, got {ids.dtype}")
    return ids.to(torch.int32)


def captured(path: Path | str, experts: int, topk: int) -> str:
    """The routing name of the captured file ``path`` for a layer of ``experts`` experts and ``topk`` slots per
    token: ``file:<absolute path>#<digest>``; UserError where its ids do not fit the layer."""
    path = Path(path).absolute()
    ids = load_ids(path)
    if ids.shape[1] != topk:
        raise UserError(f"routing file {path}: {ids.shape[1]} experts per token; the layer routes to {topk}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= experts:
        raise UserError(f"routing file {path}: expert ids {low}..{high}; the layer has experts 0..{experts - 1}")
    digest = hashlib.sha1(read_bytes(path, gz=False, limit=ROUTING_BYTES)).hexdigest()[:12]
    return f"{CAPTURED}{path}#{digest}"


@lru_cache(maxsize=4)
def _captured_rows(routing: str) -> torch.Tensor:
    path, digest = routing[len(CAPTURED):].rsplit("#", 1)
    try:
        now = hashlib.sha1(read_bytes(path, gz=False, limit=ROUTING_BYTES)).hexdigest()[:12]
    except UserError as e:
        raise UserError(f"routing file {e}") from None
    if now != digest:
        raise UserError(f"routing file {path} changed since it was named ({digest}): name it again")
    return load_ids(path)
