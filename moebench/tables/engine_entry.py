"""An entry of vLLM's or SGLang's config file read as the engine reads it: the tile keys its kernel launch takes,
in the ranges that launch takes, and the other keys kept as the file has them.

{"BLOCK_SIZE_M": 8, ..., "USE_TMA": true} -> ``engine_tile`` (a ``TileConfig`` where moebench's own ranges hold
the values, else an ``EngineTile``) + the other keys (``extras``, written back by ``ConfigTable.to_json``).

Neither engine checks an entry: vLLM passes its keys to the Triton launch of its kernel
(``fused_moe_kernel[grid](..., **config)``), the block sizes and GROUP_SIZE_M as ``tl.constexpr`` (the kernel has
no default for them; ``tl.arange`` needs the block sizes as powers of two) and num_warps and num_stages as launch
options (Triton's 4 and 3 where absent). vLLM ships ``BLOCK_SIZE_M: 8`` at M=1-4 of some H200 tables, below
moebench's own kernel's 16, so an entry outside ``TileConfig``'s ranges is an ``EngineTile``, which holds the
engine's ranges instead. SGLang does the same after popping ``USE_TMA`` (its kernel reading tiles by TMA) from
the entry. moebench's engine-form path (triton-classic) runs the six keys; a carried key is named, not timed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple, dataclass, fields

from moebench.errors import UserError
from moebench.tile import FIELD, TileConfig

SIX = tuple(f.name for f in fields(TileConfig) if FIELD[f.name].engine)  # the keys the kernel launch takes
REQUIRED = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")  # constexprs with no default
# Keys an engine takes out of an entry before the launch, and what each says: carried, not timed.
POPPED = {"sglang": {"USE_TMA": "SGLang's kernel reads the tiles by TMA"}}


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


@dataclass(frozen=True, eq=False)
class EngineTile(TileConfig):
    """A config of the engines' kernel form in the ranges their launch takes, not moebench's kernel's (e.g.
    BLOCK_SIZE_M 8): block sizes powers of two, GROUP_SIZE_M >= 1, num_warps a power of two up to 32,
    num_stages >= 1, every moebench-only field at its default. Equal to the ``TileConfig`` of the same fields."""

    def __post_init__(self) -> None:
        for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
            if not _pow2(getattr(self, name)):
                raise UserError(f"tile config: {name}={getattr(self, name)} must be a power of two")
        if self.GROUP_SIZE_M < 1:
            raise UserError(f"tile config: GROUP_SIZE_M={self.GROUP_SIZE_M} must be >= 1")
        if not _pow2(self.num_warps) or self.num_warps > 32:
            raise UserError(f"tile config: num_warps={self.num_warps} must be a power of two up to 32")
        if self.num_stages < 1:
            raise UserError(f"tile config: num_stages={self.num_stages} must be >= 1")
        if not self.portable:
            raise UserError("tile config: an engine's entry holds the engines' six keys only")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TileConfig) and astuple(self) == astuple(other)

    def __hash__(self) -> int:
        return hash(astuple(self))


def engine_tile(values: Mapping[str, int]) -> TileConfig:
    """The config of the six engine keys in ``values`` (missing num_warps, num_stages: Triton's defaults): a
    ``TileConfig`` where its ranges hold them, else an ``EngineTile``; a value outside the engine's ranges is a
    UserError."""
    six = {k: values[k] for k in SIX if k in values}
    try:
        return TileConfig(**six)
    except UserError:
        return EngineTile(**six)


def read_entry(value: object, engine: str | None = None) -> tuple[TileConfig, dict]:
    """(config, carried keys) of one entry of an engine's file; ``engine`` ("vllm", "sglang", None: either)
    names whose keys it pops. A missing required key, a value that is no integer (booleans, floats and strings
    are not), or one out of the launch's range is a UserError."""
    if not isinstance(value, Mapping):
        raise UserError("expected an object of tile parameters")
    missing = [k for k in REQUIRED if k not in value]
    if missing:
        raise UserError(f"tile config: missing key {missing[0]!r}")
    for k in SIX:
        v = value.get(k, 1)
        if isinstance(v, bool) or not isinstance(v, int):
            raise UserError(f"tile config: {k} must be an integer, not {str(v)[:20]!r}")
    extras = {k: v for k, v in value.items() if k not in SIX}
    for k, v in extras.items():
        if not isinstance(k, str) or isinstance(v, (dict, list)):
            raise UserError(f"tile config: key {str(k)[:40]!r} holds no single value")
    return engine_tile(value), extras


def carried_note(extras: Mapping[int, Mapping], engine: str | None, reader: str) -> str | None:
    """One line naming the keys a table carries beside the six (at which M), or None where it carries none."""
    keys: dict[str, list[int]] = {}
    for m, more in extras.items():
        for k in more:
            keys.setdefault(k, []).append(m)
    if not keys:
        return None
    popped = POPPED.get(engine or "", {})
    parts = [f"{k} at M={','.join(map(str, ms[:6]))}{',...' if len(ms) > 6 else ''}"
             + (f" ({popped[k]})" if k in popped else f" (passed to {reader}'s kernel launch as is)")
             for k, ms in keys.items()]
    return f"the file carries {'; '.join(parts)}: kept as it is; moebench's engine-form kernel times the six keys"
