"""The rows of a step run (``rows.jsonl``): one per (model, dtype, path, phase, batch, length) part, declared once.

A part's row says what it is (``part``, and ``path`` for the MoE layer and the stack; None for the parts every path
shares), how many of it one step runs (``count``), whether its time was measured (``measured``: False for the
all-reduces, modelled from a bus bandwidth) and what was modelled about it (``note``), then the check against
float32, the time and its floor, as a sweep's row does. A stack row (``part`` "stack") is ``stack_layers`` real
consecutive layers timed whole, beside the sum of the same parts timed alone (``parts_us``).
"""

from __future__ import annotations

STEP_COLUMNS = (
    "model", "dtype", "path", "phase", "batch", "length", "tokens", "part", "count", "measured", "status", "correct",
    "rel_err", "time_us", "time_p20_us", "time_p80_us", "reps", "timing_method", "bytes", "flops", "floor_us",
    "bound", "pct_of_floor", "config", "config_source", "experts_touched", "stack_layers", "parts_us", "note",
    "error", "interpreter", "device",
)
PARTS = ("attention", "router", "moe", "shared", "dense_mlp", "head", "allreduce", "stack")
SHARED_PARTS = ("attention", "router", "shared", "dense_mlp", "head", "allreduce")  # one row for every path


def blank_row(**given) -> dict:
    """A row with every column (None where not ``given``)."""
    unknown = set(given) - set(STEP_COLUMNS)
    if unknown:
        raise ValueError(f"not step columns: {sorted(unknown)}")
    return {c: given.get(c) for c in STEP_COLUMNS}
