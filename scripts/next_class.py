"""``moebench sweep`` with the next tile class's shapes added to every point's tuner candidates.

An experiment on the tuner's class rule (``tuning._shapes``): at 16 slots per expert, the next class's 32-row
tiles beat the decode class's 16-row ones by 1.04-1.19x (results/h200-session21). This runs the CLI with each
point's candidates taken from its own class, its busy expert's class, and the class after its own, so a tuned
sweep shows where a taller tile than the class rule gives pays elsewhere.

    PYTHONPATH=$PWD python3 scripts/next_class.py sweep --model qwen3-30b-a3b --m 1024 --tune ...
"""

from __future__ import annotations

import moebench.tuning as tuning
from moebench.cli import main

_OWN = tuning._shapes
_ORDER = [shapes for _, shapes in tuning._HEIGHTS]  # the classes, lowest tiles first
_NEXT = dict(zip(_ORDER, _ORDER[1:] + [()]))


def _with_next(per_expert: float) -> tuple[tuning.TileConfig, ...]:
    return tuple(dict.fromkeys(_OWN(per_expert) + _NEXT[tuning._classes(per_expert)]))


if __name__ == "__main__":  # not in a worker process started by spawn (moebench.precompile)
    tuning._shapes = _with_next
    main()
