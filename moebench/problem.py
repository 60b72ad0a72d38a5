"""One benchmark point, and the deterministic inputs it is run on.

A ``Problem`` is frozen and hashable: (model shape, M tokens, dtype, routing,
seed). ``make_weights`` and ``make_inputs`` build its tensors from the seed, so
the same point gets the same numbers on every machine and run; weights are
shared by all M of one (shape, dtype, seed), activations and routing are drawn
per point.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from moebench.dtypes import DtypeSpec, get_dtype
from moebench.errors import UserError
from moebench.models import MoEShape
from moebench.quant import quantize_weight, static_act_scales
from moebench.routing import ROUTINGS, route


@dataclass(frozen=True)
class Problem:
    shape: MoEShape
    M: int  # tokens in the batch
    dtype: str  # a name from moebench.dtypes.DTYPES
    routing: str = "uniform"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.M <= 0:
            raise UserError(f"M must be a positive token count, got {self.M}")
        get_dtype(self.dtype)
        if self.routing not in ROUTINGS:
            raise UserError(f"unknown routing {self.routing!r}; known: {', '.join(ROUTINGS)}")

    @property
    def spec(self) -> DtypeSpec:
        return get_dtype(self.dtype)

    @property
    def flops(self) -> int:
        """Multiply-adds of both expert GEMMs, counted as 2 FLOPs: 2 * M * topk * 3 * I * hidden."""
        s = self.shape
        return 2 * self.M * s.topk * 3 * s.intermediate * s.hidden

    def min_bytes(self, experts_touched: int) -> int:
        """Fewest bytes any implementation must move: touched experts' weights (and scales),
        the activations read once and the output written once."""
        s, d = self.shape, self.spec
        per_expert = 3 * s.intermediate * s.hidden * d.weight_bytes
        if d.fp8_scheme == "channel":
            per_expert += 4 * (2 * s.intermediate + s.hidden)
        elif d.fp8_scheme == "block128":
            per_expert += 4 * 3 * -(-s.intermediate // 128) * -(-s.hidden // 128)
        activations = 2 * self.M * s.hidden * d.act_bytes
        return experts_touched * per_expert + activations


@dataclass
class Weights:
    w13: torch.Tensor  # [E, 2I, hidden]: gate rows, then up rows
    w2: torch.Tensor  # [E, hidden, I]
    w13_scale: torch.Tensor | None  # fp8 only; shape per moebench.quant
    w2_scale: torch.Tensor | None
    fp8_scheme: str | None
    act_scale: torch.Tensor | None = None  # [2] float32, static fp8 only: GEMM1's and GEMM2's input scales


@dataclass
class MoEInputs:
    x: torch.Tensor  # [M, hidden]
    topk_weights: torch.Tensor  # [M, topk] float32
    topk_ids: torch.Tensor  # [M, topk] int32
    weights: Weights

    @cached_property
    def experts_touched(self) -> int:
        """Distinct experts the routing uses (host sync once per inputs; call outside timed regions)."""
        return int(torch.unique(self.topk_ids).numel())


def make_weights(shape: MoEShape, dtype: str, seed: int, device: torch.device | str) -> Weights:
    """Random expert weights scaled so activations stay O(1) through both GEMMs."""
    spec = get_dtype(dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    E, H, I = shape.experts, shape.hidden, shape.intermediate
    build = spec.act if spec.is_fp8 else spec.weight
    w13 = torch.randn(E, 2 * I, H, generator=gen, device=device, dtype=build) * H**-0.5
    w2 = torch.randn(E, H, I, generator=gen, device=device, dtype=build) * I**-0.5
    if not spec.is_fp8:
        return Weights(w13, w2, None, None, None)
    act_scale = static_act_scales(w13, spec.act, gen) if spec.static_act else None
    q13, s13 = quantize_weight(w13, spec.fp8_scheme)
    del w13
    q2, s2 = quantize_weight(w2, spec.fp8_scheme)
    return Weights(q13, q2, s13, s2, spec.fp8_scheme, act_scale)


def make_inputs(problem: Problem, device: torch.device | str, weights: Weights | None = None,
                draw: int = 0) -> MoEInputs:
    """Activations and routing for ``problem``; ``draw`` picks a fresh independent set (0: the one a sweep
    checks and times)."""
    s = problem.shape
    if weights is None:
        weights = make_weights(s, problem.dtype, problem.seed, device)
    seed = problem.seed * 1_000_003 + problem.M * 7919 + draw + 1
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(problem.M, s.hidden, generator=gen, device=device, dtype=problem.spec.act)
    topk_weights, topk_ids = route(problem.M, s.experts, s.topk, problem.routing, seed, device)
    return MoEInputs(x, topk_weights, topk_ids, weights)
