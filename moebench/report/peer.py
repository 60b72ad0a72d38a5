"""A run's points against another kernel's times on the same points (``report --peer FILE``), such as vLLM's own
kernel timed on the benchmark points.

A peer file is JSON Lines: one point per line with ``model``, ``dtype``, ``M`` and the peer's time in microseconds
under ``--peer-field`` (default ``time_us``); lines without them (a header of provenance) are skipped. Each point
of the run's path (default ``triton``) takes its fastest status-ok row (``tables.best_ok_points``), and
``speedup = peer_us / time_us`` (above 1: the run is faster). Times from different runs: read a ratio within a
few percent as a tie.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from moebench.bounded import NotJSON, Refused, parse_json, read_text
from moebench.errors import UserError, short
from moebench.report.tables import best_ok_points

KEY = ["model", "dtype", "M"]
COLUMNS = [*KEY, "time_us", "peer_us", "speedup"]


def read_peer(path: Path | str, field: str = "time_us") -> pd.DataFrame:
    """The peer's time per (model, dtype, M) from ``path``; UserError (one line) for a file that cannot be read,
    a line that is not JSON, or no line with the key and ``field``."""
    path = Path(path)
    try:
        lines = read_text(path, gz=False).splitlines()
    except Refused as e:
        raise UserError(f"--peer {path}: cannot be read ({e.why})") from None
    points = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = parse_json(line, f"--peer {path}:{n}")
        except NotJSON:
            raise UserError(f"--peer {path}:{n}: not a JSON line") from None
        t = rec.get(field) if isinstance(rec, dict) else None
        if not isinstance(rec, dict) or any(k not in rec for k in KEY) or not isinstance(t, (int, float)) or t <= 0:
            continue
        if isinstance(rec["M"], bool) or not isinstance(rec["M"], int):
            raise UserError(f"--peer {path}:{n}: M is {short(rec['M'])}, not a token count")
        points[(str(rec["model"]), str(rec["dtype"]), rec["M"])] = float(t)
    if not points:
        raise UserError(f"--peer {path}: no line with model, dtype, M and a positive {field!r}")
    return pd.DataFrame([(*k, t) for k, t in points.items()], columns=[*KEY, "peer_us"])


def peer_table(df: pd.DataFrame, peer: pd.DataFrame, path: str = "triton") -> pd.DataFrame:
    """Per point both have: the run's fastest ok time of ``path`` (as the throughput table picks it), the
    peer's, and peer / run."""
    best = best_ok_points(df)
    best = best[(best["path"] == path) & best["time_us"].notna()].groupby(KEY, as_index=False)["time_us"].min()
    both = best.merge(peer, on=KEY, how="inner").sort_values(KEY, kind="stable").reset_index(drop=True)
    return both.assign(speedup=both["peer_us"] / both["time_us"])[COLUMNS]


def summary(table: pd.DataFrame, peer_points: int) -> str:
    """One line: points matched, geometric mean speedup, the lowest and how many are behind."""
    if table.empty:
        return f"no point of the run is in the peer file ({peer_points} points there)"
    geo = math.exp(table["speedup"].map(math.log).mean())
    low = table.loc[table["speedup"].idxmin()]
    behind = int((table["speedup"] < 1).sum())
    return (f"{len(table)} of the peer's {peer_points} points: geometric mean {geo:.3f}x, {behind} behind; lowest "
            f"{low['speedup']:.3f}x ({low['model']} {low['dtype']} M={low['M']})")
