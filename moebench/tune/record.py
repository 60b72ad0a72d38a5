"""Tuning runs as compact timing tables: what the strategies' tests replay, small enough to commit.

A run folder's rows carry every column of a sweep; a recording keeps, per row, M, the phase, the six engine
parameters (moebench's kernel's own fields as a label), the status, the failure and the time, as CSV.
``replay_times`` reads one back as the (M, config key) -> screen time map ``ReplayBench`` answers from.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from moebench.store.runfolder import load_run
from moebench.tile import FIELDS, TileConfig

ENGINE = [f.name for f in FIELDS if f.engine]
COLUMNS = ["M", "phase", *ENGINE, "own", "status", "failure", "time_us", "time_p20_us", "time_p80_us", "reps"]


def _own(config: dict) -> str:
    """The marks of the config's moebench-only fields away from their defaults ("" if none): its short label
    after the engine fields' marks (the shape, w, s, and g where GROUP_SIZE_M is not 1; ``tile.FIELDS`` lists
    the engine fields first)."""
    cfg = TileConfig.from_dict(config)
    return " ".join(cfg.label.split(" ")[3 + (cfg.GROUP_SIZE_M != 1):])


def compact(run_dir: Path | str) -> pd.DataFrame:
    """The rows of a tune's run folder as a recording (``COLUMNS``)."""
    _, df = load_run(run_dir)
    df = df[df["config"].notna()]
    cfg = pd.DataFrame([dict(c) for c in df["config"]], index=df.index)
    own = df["config"].map(_own)
    out = pd.concat([df[["M", "phase"]], cfg[ENGINE], own.rename("own"),
                     df[["status", "failure", "time_us", "time_p20_us", "time_p80_us", "reps"]]], axis=1)
    return out[COLUMNS].reset_index(drop=True)


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
