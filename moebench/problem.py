"""One benchmark point, and the deterministic inputs it is run on.

A ``Problem`` is frozen and hashable: (model shape, M tokens, dtype, routing,
seed). ``make_weights`` and ``make_inputs`` build its tensors from the seed, so
the same point gets the same numbers on every machine and run; weights are
shared by all M of one (shape, dtype, seed), activations and routing are drawn
per point. A shape of expert parallelism through an expert_map (``models.EPMapShape``) draws its ids over
the global experts and gets the map of rank 0 (global ids 0..E_local-1 local, the rest -1).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import torch

from moebench.dtypes import DtypeSpec, get_dtype
from moebench.errors import UserError, short
from moebench.models import MoEShape
from moebench.quant import empty_quantized, quantize_into, scale_shape, static_act_scales
from moebench.routing import check_routing, route, with_shared

# Seeds are 0 to 2^32 - 1: numpy's generators take no negative seed, and make_inputs' derived seed
# (seed * 1_000_003 + ...) must stay within torch's 64-bit one.
SEED_MAX = 2**32 - 1
M_MAX = 1 << 20  # tokens in one batch: 256x a served prefill chunk (4096); past it the inputs outgrow any GPU


def check_seed(seed) -> int:
    """``seed`` where it is an integer from 0 to ``SEED_MAX``; a UserError (one line) where not."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= SEED_MAX:
        raise UserError(f"seed must be an integer from 0 to {SEED_MAX}, got {short(seed)}")
    return seed


@dataclass(frozen=True)
class Problem:
    shape: MoEShape
    M: int  # tokens in the batch
    dtype: str  # a name from moebench.dtypes.DTYPES
    routing: str = "uniform"
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.M, bool) or not isinstance(self.M, numbers.Integral) or not 0 < self.M <= M_MAX:
            raise UserError(f"M must be a token count from 1 to {M_MAX}, got {short(self.M)}")
        get_dtype(self.dtype)
        check_routing(self.routing)
        check_seed(self.seed)

    @property
    def spec(self) -> DtypeSpec:
        return get_dtype(self.dtype)

    @property
    def flops(self) -> int:
        """Multiply-adds of both expert GEMMs, counted as 2 FLOPs: 2 * M * topk * 3 * I * hidden. With an
        expert_map only the slots of local experts are computed: ``slot_flops(inputs.local_slots)`` counts those."""
        return self.slot_flops(self.M * self.shape.topk)

    def slot_flops(self, slots: int) -> int:
        """The FLOPs of both expert GEMMs over ``slots`` token slots: 2 * slots * 3 * I * hidden."""
        s = self.shape
        return 2 * slots * 3 * s.intermediate * s.hidden

    def min_bytes(self, experts_touched: int) -> int:
        """Fewest bytes any implementation must move: touched experts' weights (and scales),
        the activations read once and the output written once. Under an expert_map ``experts_touched``
        counts local experts only; x and the output stay the whole batch's (every token's row is written,
        zeros where no local expert is routed to)."""
        s, d = self.shape, self.spec
        per_expert = 3 * s.intermediate * s.hidden * d.weight_bytes
        if d.fp8_scheme is not None:  # float32 scales, as quantize_weight shapes them for w13 and w2
            for weight in ((1, 2 * s.intermediate, s.hidden), (1, s.hidden, s.intermediate)):
                per_expert += 4 * math.prod(scale_shape(weight, d.fp8_scheme))
        activations = 2 * self.M * s.hidden * d.act_bytes
        return experts_touched * per_expert + activations

    def bytes_needed(self, reference: bool = True) -> int:
        """Bytes the point holds at once, at least: every expert's weights as ``make_weights`` builds them (fp8
        ones in their activation dtype first), the inputs (x, top-k weights and ids), the output, and, with
        ``reference``, the float32 reference's copy of x, its output and one expert's float32 weights."""
        s, d = self.shape, self.spec
        weight_bytes = d.act_bytes if d.is_fp8 else d.weight_bytes
        weights = s.experts * 3 * s.intermediate * s.hidden * weight_bytes
        inputs = self.M * s.hidden * d.act_bytes + self.M * s.topk * (4 + 4)
        output = self.M * s.hidden * d.act_bytes
        ref = 2 * self.M * s.hidden * 4 + 3 * s.intermediate * s.hidden * 4 if reference else 0
        return weights + inputs + output + ref


def memory_bytes(device: torch.device | str) -> int:
    """The memory tensors on ``device`` can take: a GPU's total memory, or this machine's RAM for the CPU (the
    Triton interpreter's device)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_fits(problems: Iterable[Problem], device: torch.device | str, reference: bool = True) -> None:
    """UserError naming the first of ``problems`` whose ``bytes_needed`` exceed ``device``'s memory: called
    before a command creates anything, so a size that cannot fit is one line, not an allocation failure."""
    capacity = memory_bytes(device)
    for p in problems:
        needed = p.bytes_needed(reference)
        if needed > capacity:
            where = "this machine's memory" if torch.device(device).type == "cpu" else "the GPU's memory"
            what = "weights, inputs, output" + (" and float32 reference" if reference else "")
            raise UserError(f"{p.shape.name} {p.dtype} M={p.M} (experts={p.shape.experts}, hidden={p.shape.hidden}, "
                            f"intermediate={p.shape.intermediate}) needs {_gib(needed)} ({what}), more than the "
                            f"{_gib(capacity)} of {where}")


@dataclass
class Weights:
    w13: torch.Tensor  # [E, 2I, hidden]: gate rows, then up rows
    w2: torch.Tensor  # [E, hidden, I]
    w13_scale: torch.Tensor | None  # fp8 only; shape per moebench.quant
    w2_scale: torch.Tensor | None
    fp8_scheme: str | None
    act_scale: torch.Tensor | None = None  # [2] float32, static fp8 only: GEMM1's and GEMM2's input scales
    block_shape: tuple[int, int] = (128, 128)  # fp8 "block128" scales: (block_n, block_k)


@dataclass
class MoEInputs:
    x: torch.Tensor  # [M, hidden]
    topk_weights: torch.Tensor  # [M, topk] float32
    topk_ids: torch.Tensor  # [M, topk] int32: local experts, or global ones with expert_map
    weights: Weights
    expert_map: torch.Tensor | None = None  # [global experts] int32: local expert of each global id, -1 elsewhere

    @cached_property
    def _local_ids(self) -> torch.Tensor:
        """The ids' local experts, those of other ranks left out: [slots of local experts] int32."""
        if self.expert_map is None:
            return self.topk_ids.reshape(-1)
        local = self.expert_map[self.topk_ids.reshape(-1).long()]
        return local[local >= 0]

    @cached_property
    def experts_touched(self) -> int:
        """Distinct local experts the routing uses (host sync once per inputs; call outside timed regions)."""
        return int(torch.unique(self._local_ids).numel())

    @cached_property
    def local_slots(self) -> int:
        """Token slots routed to local experts: M * topk without an expert_map (host sync, as above)."""
        return int(self._local_ids.numel())


def rank0_map(shape: MoEShape, device: torch.device | str) -> torch.Tensor | None:
    """The expert_map of rank 0 under ``shape``'s expert parallelism, [global experts] int32: global ids
    0..experts-1 are its local experts 0..experts-1, the rest -1; None for a shape without one."""
    if not shape.mapped:
        return None
    local = torch.full((shape.routed_experts,), -1, dtype=torch.int32, device=device)
    local[: shape.experts] = torch.arange(shape.experts, dtype=torch.int32, device=device)
    return local


def make_weights(shape: MoEShape, dtype: str, seed: int, device: torch.device | str) -> Weights:
    """Random expert weights scaled so activations stay O(1) through both GEMMs. FP8 weights are allocated
    before the bf16 draw's temporaries and quantized one expert at a time (``quant.quantize_into``)."""
    spec = get_dtype(dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    E, H, I = shape.experts, shape.hidden, shape.intermediate
    build = spec.act if spec.is_fp8 else spec.weight
    w13 = torch.randn(E, 2 * I, H, generator=gen, device=device, dtype=build) * H**-0.5
    w2 = torch.randn(E, H, I, generator=gen, device=device, dtype=build) * I**-0.5
    if not spec.is_fp8:
        return Weights(w13, w2, None, None, None)
    (q13, s13), (q2, s2) = empty_quantized(w13, spec.fp8_scheme), empty_quantized(w2, spec.fp8_scheme)
    act_scale = static_act_scales(w13, spec.act, gen) if spec.static_act else None
    quantize_into(w13, spec.fp8_scheme, q13, s13)
    quantize_into(w2, spec.fp8_scheme, q2, s2)
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
    fused = getattr(s, "fused", 0)  # a FusedShape's shared experts, routed for every token as the last ids
    topk_weights, topk_ids = route(problem.M, s.routed_experts - fused, s.topk - fused, problem.routing, seed, device)
    if fused:
        topk_weights, topk_ids = with_shared(topk_weights, topk_ids, s.experts - fused, fused)
    return MoEInputs(x, topk_weights, topk_ids, weights, rank0_map(s, device))
