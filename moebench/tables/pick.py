"""The best tile config per table and M from a run's rows: ``timed_rows`` keeps the rows that may pick, ``best_of``
picks (``best_configs`` does both).

rows (path, status, correct, phase) -> timed_rows -> best_of -> {(experts, intermediate, dtype, device): ConfigTable}

A table is keyed by the per-GPU shape that was benchmarked (vLLM's E and N), the dtype and the device. The engines'
kernel form (``ENGINE_PATH``) reads six tile fields, so its rows are read as those six; moebench's kernel keeps
every field. Rows of one table at one M may come from several problems (hidden size, top-k, routing): their raw
times are not comparable, so each config is scored by its time over each problem's fastest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from moebench.errors import UserError
from moebench.tables.table import ENGINE_PATH, ConfigTable
from moebench.tile import FIELDS, TileConfig

ENGINE_KEYS = tuple(f.name for f in FIELDS if f.engine)  # the six parameters the engines' kernel reads
TABLE_KEY = ("experts", "intermediate", "dtype", "device_name")  # the key of best_configs' result
PICK_PHASES = ("default", "final")  # a tune's re-timings, most comparable first (see timed_rows)
_PROBLEM = ("model", "hidden", "topk", "routing")  # what else can differ between rows of one table


def flag(v: object) -> bool | None:
    """A row's bool column as True/False, or None where it is missing."""
    return None if v is None or pd.isna(v) else bool(v)


def _tile(config: Mapping, path: str) -> TileConfig:
    """A row's config as the path ran it: the engines' form reads the six engine fields only, in the ranges the
    engines' launch takes (``engine_entry``: an engine's BLOCK_SIZE_M 8 entry re-timed reads back)."""
    if path == ENGINE_PATH:
        from moebench.tables.engine_entry import engine_tile

        return engine_tile({k: int(v) for k, v in config.items() if k in ENGINE_KEYS})
    return TileConfig.from_dict(dict(config))


def table_key(values: tuple) -> tuple:
    """(experts, intermediate, dtype, device_name) of a row, typed as ``best_configs``' keys are."""
    experts, n, dtype, device = values
    return int(experts), int(n), str(dtype), str(device)


def timed_rows(df: pd.DataFrame, path: str = ENGINE_PATH) -> pd.DataFrame:
    """The rows of ``path`` that can pick a config: status ok, not found incorrect, a config and a time; at a
    (table, M) that has rows of phase "default" (a tune's choice and the path's default re-timed back to
    back), only those, so a table never holds a config slower than the default beside it; else of phase
    "final" (the re-timings of a tune's best candidates), only those.

    Adds ``_tile`` (the row's TileConfig as the path ran it) and ``_table`` (its key in ``best_configs``'
    result). Rows from the CPU interpreter are refused (UserError): their timings say nothing about which
    tile is fastest on a GPU.
    """
    rows = df[(df["path"] == path) & (df["status"] == "ok") & df["time_us"].notna()]
    rows = rows[rows["config"].map(lambda c: isinstance(c, Mapping)).astype(bool)]
    if "correct" in rows.columns:
        rows = rows[rows["correct"].map(lambda v: flag(v) is not False).astype(bool)]
    if rows.empty:
        return rows.assign(_tile=None, _table=None)
    if "interpreter" in rows.columns and rows["interpreter"].map(lambda v: flag(v) is True).any():
        raise UserError("tile configs come from GPU runs only; this run timed the CPU interpreter")
    for phase in PICK_PHASES:  # the first phase a (table, M) has rows of, only those
        at = rows["phase"].eq(phase) if "phase" in rows.columns else pd.Series(False, index=rows.index)
        has = at.groupby([rows[c] for c in (*TABLE_KEY, "M")], dropna=False).transform("any")
        rows = rows[at | ~has.astype(bool)]
    keys = [table_key(k) for k in rows[list(TABLE_KEY)].itertuples(index=False, name=None)]
    return rows.assign(_tile=rows["config"].map(lambda c: _tile(c, path)), _table=keys)


def best_configs(df: pd.DataFrame, path: str = ENGINE_PATH) -> dict[tuple, ConfigTable]:
    """The fastest tile config per (experts, intermediate, dtype, device_name) and M, from a run's rows of
    ``path`` (``timed_rows``): by default the engines' kernel form, whose six fields are what their files hold;
    with ``path="triton"``, moebench's own kernel with every tile field.

    ``intermediate`` and ``experts`` must be the per-GPU shape that was benchmarked
    (vLLM's N and E). Every M with a timed row is a key.

    When rows of one table at one M come from several problems (models with the
    same E and N but another hidden size or top-k, or several routing
    distributions), raw times are not comparable: each config is scored by its
    time over the best time of the same problem, averaged over the problems,
    among the configs measured on the most problems. With one problem this is
    simply the lowest time_us.
    """
    return best_of(timed_rows(df, path))


def best_of(rows: pd.DataFrame) -> dict[tuple, ConfigTable]:
    """``best_configs`` of rows ``timed_rows`` chose."""
    if rows.empty:
        return {}
    problem = [c for c in _PROBLEM if c in rows.columns]
    tables: dict[tuple, dict[int, TileConfig]] = {}
    for key, group in rows.groupby("_table", sort=True):
        per_m = tables.setdefault(key, {})
        for m, at_m in group.groupby("M", sort=True):
            per_m[int(m)] = _pick(at_m, problem)
    return {k: ConfigTable(v) for k, v in tables.items()}


def _pick(at_m: pd.DataFrame, problem: list[str]) -> TileConfig:
    """The config with the best mean time relative to each problem's fastest (see best_configs)."""
    times: dict[tuple, dict[tuple, float]] = {}  # config key -> problem -> its best time there
    tiles: dict[tuple, TileConfig] = {}
    for tile, *prob, t in at_m[["_tile", *problem, "time_us"]].itertuples(index=False, name=None):
        prob_key = tuple(None if pd.isna(v) else v for v in prob)
        per_problem = times.setdefault(tile.key(), {})
        per_problem[prob_key] = min(float(t), per_problem.get(prob_key, math.inf))
        tiles[tile.key()] = tile
    fastest: dict[tuple, float] = {}
    for per_problem in times.values():
        for prob_key, t in per_problem.items():
            fastest[prob_key] = min(t, fastest.get(prob_key, math.inf))
    most = max(len(per_problem) for per_problem in times.values())
    scores = {
        key: sum(t / fastest[p] for p, t in per_problem.items()) / len(per_problem)
        for key, per_problem in times.items()
        if len(per_problem) == most
    }
    return tiles[min(scores, key=lambda key: (scores[key], key))]
