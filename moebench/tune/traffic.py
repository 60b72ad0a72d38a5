"""Tuning for served traffic: a histogram of batch token counts (``--m-weights``) places a table's keys and
weighs its times.

A histogram file is text: one token count per line (a batch seen, such as the prompt lengths ``trace --csv``
reads), or ``tokens,count`` pairs; a header line and blank lines are skipped. ``keys_for`` puts a table's keys at
the weighted quantiles of the histogram (so most keys sit where most batches are), and ``expected_us`` is the
time of one batch drawn from the histogram when each M reads its nearest key, as the engines read tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from moebench.bounded import Refused, read_text
from moebench.errors import UserError, short
from moebench.tables.table import nearest_key as table_nearest_key

MAX_KEYS = 18  # as many keys as vLLM's tuner writes


def read_weights(path: Path | str) -> dict[int, float]:
    """Token count -> its weight (batches seen), from a histogram file (see the module docstring)."""
    path = Path(path)
    try:
        lines = read_text(path, gz=False).splitlines()
    except Refused as e:
        raise UserError(f"--m-weights {path}: cannot be read ({e.why})") from None
    weights: dict[int, float] = {}
    for n, line in enumerate(lines, 1):
        parts = [p.strip() for p in line.split(",")]
        if not parts[0] or (n == 1 and not parts[0].lstrip("-").isdigit()):
            continue  # a blank line, or a header
        try:
            tokens = int(parts[0])
            count = float(parts[1]) if len(parts) > 1 and parts[1] else 1.0
        except ValueError:
            raise UserError(f"--m-weights {path}:{n}: expected 'tokens' or 'tokens,count', got {short(line.strip())}") \
                from None
        if tokens < 1 or not 0 <= count < float("inf") or len(parts) > 2:
            raise UserError(f"--m-weights {path}:{n}: a positive token count and a count >= 0, "
                            f"got {short(line.strip())}")
        weights[tokens] = weights.get(tokens, 0.0) + count
    if not weights or sum(weights.values()) <= 0:
        raise UserError(f"--m-weights {path}: no token counts in it")
    return weights


def keys_for(weights: Mapping[int, float], n: int = MAX_KEYS) -> tuple[int, ...]:
    """At most ``n`` token counts at the weighted quantiles of ``weights`` (the smallest and largest seen
    included), each a count the histogram holds."""
    ms = sorted(weights)
    if len(ms) <= n:
        return tuple(ms)
    total, keys, seen, i = sum(weights.values()), {ms[0], ms[-1]}, 0.0, 0
    for q in range(1, n - 1):
        target = total * q / (n - 1)
        while i < len(ms) - 1 and seen + weights[ms[i]] < target:
            seen += weights[ms[i]]
            i += 1
        keys.add(ms[i])
    return tuple(sorted(keys))


def nearest_key(keys, m: int) -> int:
    """The key the engines read for M tokens from a table written in ascending M: the smaller on a tie."""
    return table_nearest_key(sorted(keys), m)


def expected_us(weights: Mapping[int, float], times: Mapping[int, float]) -> float:
    """The time of one batch drawn from ``weights`` when M reads the key of ``times`` nearest to it."""
    total = sum(weights.values())
    return sum(w * times[nearest_key(times, m)] for m, w in weights.items()) / total


def under_traffic(weights: Mapping[int, float], tuned: Mapping[int, float | None],
                  default: Mapping[int, float | None]) -> dict | None:
    """The expected time per batch under ``weights`` with the tuned table and with the default, each M reading
    its nearest key; None where some key has no time."""
    if not weights or any(v is None for v in (*tuned.values(), *default.values())) or not tuned or not default:
        return None
    ours, theirs = expected_us(weights, tuned), expected_us(weights, default)
    return {"batches": sum(weights.values()), "tuned_us": ours, "default_us": theirs, "gain": theirs / ours}
