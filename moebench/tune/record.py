"""Recorded tuning runs read back: what the strategies' tests replay.

A recording is a CSV of a tune's rows, small enough to commit: per row M, the phase, the six engine parameters
(``own``: the marks of moebench's kernel's own fields, where any is off its default), the status, the failure and
the times. ``replay_times`` reads one back as the (M, config key) -> screen time map ``ReplayBench``
answers from.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from moebench.tile import FIELDS, TileConfig

ENGINE = [f.name for f in FIELDS if f.engine]


def replay_times(recording: Path | str | pd.DataFrame) -> dict[tuple[int, tuple], float | None]:
    """(M, config key) -> the recorded screen time, or None for a config that failed (at every M tuned, where
    its first run failed). Only configs with moebench-only fields off (``own`` empty) are read."""
    df = recording if isinstance(recording, pd.DataFrame) else pd.read_csv(recording, keep_default_na=False,
                                                                          na_values={"time_us": [""]})
    ms = sorted({int(m) for m in df["M"]})
    times: dict[tuple[int, tuple], float | None] = {}
    for r in df.itertuples(index=False):
        if getattr(r, "own", ""):
            continue
        key = TileConfig(**{k: int(getattr(r, k)) for k in ENGINE}).key()
        if r.phase == "screen":
            times[(int(r.M), key)] = float(r.time_us) if r.status == "ok" else None
        elif r.phase in ("", None) and r.status != "ok":  # a first run that failed: it runs at no M
            for m in ms:
                times[(m, key)] = None
    return times
