"""Recorded tuning runs read back: what the strategies' tests replay.

A recording is a CSV of a tune's rows, small enough to commit: per row M, the phase, the six engine parameters
(``own``: the marks of moebench's kernel's own fields, where any is off its default), the status, the failure and
the times. ``replay_times`` reads one back as the (M, config key) -> screen time map ``ReplayBench``
answers from. A recording of moebench's kernel, whose configs differ in its own fields too, is a JSON-lines file
of the tune's screens and failed first runs, each with its whole config (``trim_rows``, ``replay_rows``).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
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


RECORDED_FIELDS = ("M", "phase", "status", "failure", "time_us", "config")  # what a replay reads of a row


def trim_rows(rows: Iterable[dict]) -> list[dict]:
    """A tune's rows cut to what a replay reads: its screens and its failed first runs, each with
    ``RECORDED_FIELDS`` only."""
    return [{k: r.get(k) for k in RECORDED_FIELDS} for r in rows
            if r.get("config") and (r.get("phase") == "screen" or (r.get("phase") is None and r.get("status") != "ok"))]


def replay_rows(recording: Path | str | Iterable[dict]) -> dict[tuple[int, tuple], float | None]:
    """(M, config key) -> the recorded screen time, or None for a config that failed (at every M tuned, where its
    first run failed), from rows with whole configs (a ``.jsonl`` or ``.jsonl.gz`` file, or the rows)."""
    if isinstance(recording, (str, Path)):
        opener = gzip.open if str(recording).endswith(".gz") else open
        with opener(recording, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    else:
        rows = list(recording)
    ms = sorted({int(r["M"]) for r in rows})
    times: dict[tuple[int, tuple], float | None] = {}
    for r in rows:
        key = TileConfig.from_dict(r["config"]).key()
        if r.get("phase") == "screen":
            times[(int(r["M"]), key)] = float(r["time_us"]) if r.get("status") == "ok" else None
        elif r.get("phase") is None and r.get("status") != "ok":
            for m in ms:
                times[(m, key)] = None
    return times
