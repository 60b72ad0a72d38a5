"""The range check each strategy's ``Options`` runs on itself in ``__post_init__``: an option outside its range
is a one-line UserError naming the option and the range, raised before a tune creates anything."""

from __future__ import annotations

from dataclasses import fields

from moebench.errors import UserError

MAX_COUNT = 10_000  # configs per M an option may name: more than any pruned space holds (2,400 engine configs)
MAX_STEPS = 100  # climb steps: a climb ends long before, when no leader moves


def check_ranges(strategy: str, opts, ranges: dict[str, tuple[int, int | None]]) -> None:
    """Each field of ``opts`` within its (low, high) in ``ranges`` (high None: no upper end); every field has one."""
    for f in fields(opts):
        low, high = ranges[f.name]
        value = getattr(opts, f.name)
        if not isinstance(value, int) or value < low or (high is not None and value > high):
            allowed = f"{low} or more" if high is None else f"{low} to {high}"
            raise UserError(f"strategy {strategy!r}: option {f.name}={value!r} is out of range ({allowed})")
