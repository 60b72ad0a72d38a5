"""The fitted default: the tile config for a shape without a table, from the nearest point of the tuned tables.

(shape, dtype, M) -> ``Where``: log2 of the token slots per expert, the experts touched, K (hidden) and N
(intermediate) -> the nearest tuned (table, M) point of the same dtype class (``distance``) -> its config made
runnable on the target (``fit_to``) -> a ``Fitted``; None where no point lies within ``MAX_DISTANCE``, and the
caller runs the hand-written heuristic (``tile.default_config``).

Why a nearest neighbour: a tuned config is a bundle of choices that pay together (a tile height, a split, a
route, a GEMM2 walk), so it is carried over whole, from the point whose problem looks most alike, rather than
each field guessed apart. The distance (``WEIGHTS``) counts the slots per expert in full, since they set the
tile height and whether the point is decode or prefill, and the other three at half: the experts touched set
the grid at decode, K and N the K steps and column tiles (split-K, GEMM2's walk). A table lists a point per M,
so for each target M the point of matching slots per expert is the one that wins, whatever the table's E or
top-k. Ties go to the table name, then the smaller M: the fit is deterministic, whatever order tables come in.

Dtype classes (``CLASS_OF``): 16-bit (bf16, fp16), fp8 scaled after the K loop (per tensor, static or not, per
channel), and fp8-block128 (scaled at every K step, its K step fixed at 128). A class fits from its own tables;
only where it has none within reach does fp8 borrow from 16-bit tables and 16-bit from fp8 ones (the same
kernel but for the scales); fp8-block128 and fp32 borrow from none.

``Fit`` takes an explicit list of tables (``Tuned``), so a caller can hold a shape out (``Fit.without``) and
check the fit leave-one-shape-out (``moebench fit-check``). Nothing here imports torch at import time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from moebench.errors import UserError
from moebench.hardware import DeviceLimits
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig, fit_stages, tma_rows

CLASS_OF = {"bf16": "16-bit", "fp16": "16-bit", "fp8-tensor": "fp8", "fp8-tensor-static": "fp8",
            "fp8-channel": "fp8", "fp8-block128": "fp8-block128"}  # fp32: no class, no fit
BORROW = {"16-bit": ("fp8",), "fp8": ("16-bit",), "fp8-block128": ()}  # tried in order where a class has none
OPERAND_BYTES = {"16-bit": 2, "fp8": 1, "fp8-block128": 1}  # bytes per element of the GEMMs' operands
WEIGHTS = (1.0, 0.5, 0.5, 0.5)  # slots per expert, experts touched, K, N (each as log2)
MAX_DISTANCE = 3.0  # e.g. K and N both 8x apart, or experts touched 64x apart: beyond, the heuristic
# Slots per expert beyond which the fit sees no difference: from 128 up (every expert fills its tallest tiles,
# more slots add whole tiles) each shipped H200 table keeps one main tile (128x128x64 w8 with GEMM1 merged at
# 16-bit, 64x64x128 at fp8-block128), so a prefill point past every tuned one fits from the largest.
SATURATED_SLOTS = 128
# The pruning rules of the engine fields that say what cannot compile or run (``space.prune.RULES``); with
# ``OWN_RUNNABLE``, the rules a carried config must pass.
COMPILES = ("block-scale", "shared-memory", "registers")


@dataclass(frozen=True)
class Where:
    """A problem as the fit sees it: M tokens on a layer of ``experts`` experts, top-k, hidden (K of GEMM1) and
    intermediate (N of GEMM1, per GPU)."""

    M: int
    experts: int
    topk: int
    hidden: int
    intermediate: int

    @property
    def slots(self) -> int:
        return self.M * self.topk

    @property
    def touched(self) -> float:
        """Experts that receive a slot, on average under uniform routing."""
        return self.experts * (1 - (1 - 1 / self.experts) ** self.slots)

    def features(self) -> tuple[float, ...]:
        """log2 of the slots per expert (at most ``SATURATED_SLOTS``), the experts touched, K and N (an empty
        batch placed as one token)."""
        one = self if self.M >= 1 else replace(self, M=1)
        return (math.log2(min(one.slots / one.experts, SATURATED_SLOTS)), math.log2(one.touched),
                math.log2(self.hidden), math.log2(self.intermediate))

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.experts, self.intermediate, self.hidden, self.topk


def distance(a: Where, b: Where) -> float:
    """The weighted L1 distance of the two problems' log2 features (``WEIGHTS``)."""
    return sum(w * abs(x - y) for w, x, y in zip(WEIGHTS, a.features(), b.features()))


@dataclass(frozen=True)
class Tuned:
    """One tuned table the fit reads: its file name, shape, dtype and device, and its configs by M."""

    name: str
    experts: int
    intermediate: int
    hidden: int
    topk: int
    dtype: str
    device_name: str
    table: ConfigTable
    path: Path | None = None

    def at(self, M: int) -> Where:
        return Where(M, self.experts, self.topk, self.hidden, self.intermediate)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.experts, self.intermediate, self.hidden, self.topk

    @classmethod
    def of_file(cls, path: Path) -> Tuned | None:
        """The table of a moebench table file; None where its header lists several hidden sizes or top-ks (a
        table picked across shapes places no single point) or the dtype has no class."""
        from moebench.tables.formats.moebench import load_table

        meta, table = load_table(path)
        s = meta.shape
        if not all(isinstance(s[k], int) for k in ("experts", "intermediate", "hidden", "topk")):
            return None
        if meta.dtype not in CLASS_OF:
            return None
        return cls(path.name, s["experts"], s["intermediate"], s["hidden"], s["topk"], meta.dtype, meta.device_name,
                   table, path)


@dataclass(frozen=True)
class Fitted:
    """A fitted config: the table and key it was taken from and how far that point lay."""

    config: TileConfig
    table: Tuned
    table_m: int
    distance: float

    @property
    def label(self) -> str:
        return f"fitted from {self.table.name}@M={self.table_m}"


class Fit:
    """The nearest-point fit over ``tables`` (see the module docstring)."""

    def __init__(self, tables: Iterable[Tuned], max_distance: float = MAX_DISTANCE):
        self.tables = tuple(sorted(tables, key=lambda t: t.name))
        self.max_distance = max_distance
        self._predicted: dict[tuple, Fitted | None] = {}

    def without(self, shape: tuple[int, int, int, int]) -> Fit:
        """The fit over every table but those of ``shape`` (experts, intermediate, hidden, topk), in any dtype:
        a shape that was never tuned, as a new model's is."""
        return Fit((t for t in self.tables if t.shape != shape), self.max_distance)

    def nearest(self, where: Where, dtype: str) -> list[tuple[float, Tuned, int]]:
        """(distance, table, M) of the points within ``max_distance`` of the first class that has any (the
        dtype's own, then those it borrows from), nearest first."""
        klass = CLASS_OF.get(dtype)
        for k in (klass, *BORROW.get(klass, ())) if klass else ():
            points = [(distance(where, t.at(m)), t, m) for t in self.tables if CLASS_OF.get(t.dtype) == k
                      for m in t.table]
            near = sorted((p for p in points if p[0] <= self.max_distance), key=lambda p: (p[0], p[1].name, p[2]))
            if near:
                return near
        return []

    def predict(self, where: Where, dtype: str, limits: DeviceLimits | None = None) -> Fitted | None:
        """The config of the nearest point that ``fit_to`` can make runnable for ``where`` at ``dtype``, or None."""
        key = (where, dtype, limits)
        if key not in self._predicted:
            self._predicted[key] = next(
                (Fitted(cfg, table, m, d) for d, table, m in self.nearest(where, dtype)
                 if (cfg := fit_to(table.table[m], table.at(m), where, dtype, limits)) is not None), None)
        return self._predicted[key]


def _pow2_ceil(v: int) -> int:
    return 1 << max(0, math.ceil(math.log2(v)))


def _carried(value: int, scale: float, values: Sequence[int], cap: int, down: bool = False) -> int:
    """The one of ``values`` nearest ``value * scale`` in ratio (the smaller on a tie; with ``down`` the largest
    not above it), at most ``cap`` (the smallest of ``values`` where none is)."""
    want = math.log2(value * scale)
    allowed = [v for v in values if v <= cap] or [min(values)]
    if down:
        return max([v for v in allowed if math.log2(v) <= want + 1e-9] or [min(allowed)])
    return min(allowed, key=lambda v: (abs(math.log2(v) - want), v))


def fit_to(cfg: TileConfig, tuned_at: Where, where: Where, dtype: str,
           limits: DeviceLimits | None = None) -> TileConfig | None:
    """``cfg``, tuned for the problem ``tuned_at``, made runnable and no larger than ``where``'s problem at
    ``dtype`` on ``limits`` (the current device's if not given); None where it cannot be.

    - K step: one scale block (128) at fp8-block128, else no longer than the shorter of the two GEMMs' K;
      tile widths no wider than the columns they cover;
    - tile height: no taller than ``space.prune``'s tall-tile rule keeps, tail tiles no shorter than 16 rows;
    - a tile per slot (and what needs it: x quantized by GEMM1, GEMM2's preload) only where slots are few
      against experts (the direct-many rule); GEMM1 quantizing x only at fp8-block128; TMA only on rows of a
      multiple of 16 bytes;
    - the work of a program along K as where tuned: splits over K give each program at least as many K steps
      as they did there (a K twice as long, twice the split, rounded down: a K 1.41x longer adds none; two
      steps at least; none where the unsplit grid fills two waves, the split-full rule), and GEMM2 walks as
      many column tiles times K steps (a shorter intermediate size, more column tiles; no more than hidden
      holds); each a value the search space declares, and only where
      the config allows it (GEMM2's split and preload take one column tile; its split the atomic sum);
    - num_stages lowered until the operand tiles fit shared memory, GEMM2's with an output tile where it
      walks several partial column tiles (``gemm2_smem_bytes``); the result must pass every pruning rule
      that says what cannot compile or run (``COMPILES``, ``OWN_RUNNABLE``).
    """
    from moebench.space.declared import OWN_DIMS
    from moebench.space.prune import OWN_RUNNABLE, RULES, Facts, split_full, tall_tile

    klass = CLASS_OF[dtype]
    block128, nbytes = klass == "fp8-block128", OPERAND_BYTES[klass]
    limits = limits or DeviceLimits.current()
    facts = Facts("triton", where.M, where.experts, where.topk, where.hidden, where.intermediate, nbytes, block128,
                  limits.smem_bytes, limits.sms)
    d = cfg.as_dict()
    d["BLOCK_SIZE_K"] = 128 if block128 else min(d["BLOCK_SIZE_K"],
                                                 max(16, _pow2_ceil(min(where.hidden, where.intermediate))))
    d["BLOCK_SIZE_N"] = min(d["BLOCK_SIZE_N"], max(16, _pow2_ceil(where.intermediate)))
    if d["gemm2_block_n"]:
        d["gemm2_block_n"] = min(d["gemm2_block_n"], max(16, _pow2_ceil(where.hidden)))
    if d["direct_route"] and where.slots > 2 * where.experts:
        d.update(direct_route=False, gemm1_quant_x=False, gemm2_preload=False)
    d["gemm1_quant_x"] = d["gemm1_quant_x"] and block128
    d["gemm1_tma"] = d["gemm1_tma"] and tma_rows(where.hidden, nbytes)
    space = {dim.name: dim.values for dim in OWN_DIMS}
    steps1 = -(-tuned_at.hidden // cfg.BLOCK_SIZE_K), -(-where.hidden // d["BLOCK_SIZE_K"])  # GEMM1's K steps
    steps2 = -(-tuned_at.intermediate // cfg.BLOCK_SIZE_K), -(-where.intermediate // d["BLOCK_SIZE_K"])  # GEMM2's
    d["split_k"] = _carried(cfg.split_k, steps1[1] / steps1[0], space["split_k"], steps1[1] // 2, down=True)
    if cfg.gemm2_split_k == 1 and not cfg.gemm2_preload:
        d["gemm2_n_tiles"] = _carried(cfg.gemm2_n_tiles, steps2[0] / steps2[1], space["gemm2_n_tiles"],
                                      -(-where.hidden // (d["gemm2_block_n"] or d["BLOCK_SIZE_N"])))
    d["gemm2_split_k"] = 1 if not cfg.atomic_sum or d["gemm2_n_tiles"] > 1 else _carried(
        cfg.gemm2_split_k, steps2[1] / steps2[0], space["gemm2_split_k"], steps2[1] // 2, down=True)
    try:
        out = TileConfig(**d)
        while tall_tile(out, facts):
            out = replace(out, BLOCK_SIZE_M=out.BLOCK_SIZE_M // 2,
                          tail_tiles=min(out.tail_tiles, max(0, int(math.log2(out.BLOCK_SIZE_M // 2 // 16)))))
        if out.split_k > 1 and split_full(replace(out, gemm2_split_k=1), facts):
            out = replace(out, split_k=1)
        if out.gemm2_split_k > 1 and split_full(replace(out, split_k=1), facts):
            out = replace(out, gemm2_split_k=1)
    except UserError:
        return None
    out = fit_stages(out, nbytes, limits)
    while out.num_stages > 1 and gemm2_smem_bytes(out, nbytes, where.hidden) > limits.smem_bytes:
        out = replace(out, num_stages=out.num_stages - 1)
    if any(r.drops(out, facts) for r in (*(r for r in RULES if r.name in COMPILES), *OWN_RUNNABLE)):
        return None
    return out


def gemm2_smem_bytes(cfg: TileConfig, nbytes: int, hidden: int) -> int:
    """GEMM2's pipelined operand tiles, and where a program walks several column tiles (``gemm2_n_tiles``) whose
    width does not divide ``hidden`` (GEMM2's columns) one float32 output tile too: a bound the fit keeps
    carried configs under. On gpt-oss-20b (hidden 2880) at M=4096 Triton asked 278,528 bytes for 128x128x64 s3
    with four 256-wide GEMM2 tiles per program, that sum (3 x 48 KiB + 128 KiB), over the H200's 232,448
    (``results/h200-fit-time-035a7ae``); one 256-wide tile per program runs there at s4 (gpt-oss-20b's own
    table, M = 1024-4096), and the four at s3 and s4 where 256 divides hidden (Mixtral, Qwen3-235B: 4096)."""
    n2 = cfg.gemm2_block_n or cfg.BLOCK_SIZE_N
    out_tile = cfg.BLOCK_SIZE_M * n2 * 4 if hidden % n2 and cfg.gemm2_n_tiles > 1 else 0
    return (cfg.BLOCK_SIZE_M + n2) * cfg.BLOCK_SIZE_K * nbytes * cfg.num_stages + out_tile


def fit_of(tables: Sequence[Tuned], device_name: str, max_distance: float = MAX_DISTANCE) -> Fit:
    """The fit over the tables of ``device_name`` (a device's file-name form: spaces or underscores alike)."""
    here = device_name.replace(" ", "_")
    return Fit((t for t in tables if t.device_name.replace(" ", "_") == here), max_distance)
