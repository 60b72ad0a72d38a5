"""Search strategies, one module each, with one entry point: ``search(candidates, bench, options)``.

Each returns the chosen config per M (None where nothing ran), the fastest of its "final" timings, and declares its
options as a frozen dataclass beside it. Adding a strategy adds a module and a line to ``STRATEGIES``.
"""

from __future__ import annotations

from moebench.errors import UserError
from moebench.tune.strategies import exhaustive, fast

STRATEGIES = {"fast": fast, "exhaustive": exhaustive}
DEFAULT = "fast"


def get_strategy(name: str):
    try:
        return STRATEGIES[name]
    except KeyError:
        raise UserError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None

