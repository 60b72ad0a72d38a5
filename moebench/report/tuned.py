"""What a report shows of a tune run: the chosen configs against the untuned default, and the failed candidates.

A tune's folder holds a row per candidate timing (``phase`` "screen", "final", "default", "check") and its
``best.json``. ``tuned_table`` reads the choice per M from ``best.json`` (the chosen config's time, the default's,
the speed-up), the figures the tune itself prints. Candidates that failed (did not compile, needed more shared
memory than the GPU has, ...) are part of the search, not faults of the run: ``failures_line`` counts them
by kind for one line on stderr.
"""

from __future__ import annotations

import math

import pandas as pd

from moebench.errors import UserError
from moebench.report.runs import Runs
from moebench.store.best import BestFileError, best_path, read_best

TUNED_COLUMNS = ["model", "dtype", "kernel", "M", "time_us", "default_us", "speedup", "known_us", "vs_known", "run"]


def tune_rows(df: pd.DataFrame) -> pd.Series:
    """Per row of ``df``: True where a tune wrote it (its ``phase`` is set, or its ``failure``: a candidate
    that failed has no phase)."""
    marked = pd.Series(False, index=df.index, dtype=bool)
    for column in ("phase", "failure"):
        if column in df.columns:
            marked |= df[column].map(lambda v: isinstance(v, str)).astype(bool)
    return marked


def failures_line(df: pd.DataFrame) -> str | None:
    """'N tuning candidate(s) failed (resources 40, compile 2)': the tune rows of ``df`` without a time; None
    where there are none."""
    tune = df[tune_rows(df)]
    failed = tune[tune["status"] != "ok"]
    if failed.empty:
        return None
    kinds = failed["failure"].map(lambda v: v if isinstance(v, str) else "error").value_counts()
    parts = ", ".join(f"{kind} {n}" for kind, n in kinds.items())
    return f"{len(failed)} tuning candidate(s) of {len(tune)} failed ({parts}); the run's rows hold their errors"


def tuned_table(runs: Runs) -> pd.DataFrame:
    """Per tune run (meta ``"tune": true`` and a ``best.json``) and M: the chosen config's time, the untuned
    default's, ``speedup = default_us / time_us``, the best known seed's time (moebench's kernel: the best
    hand-picked candidate, re-timed back to back) and ``vs_known = known_us / time_us`` (NaN where not timed)."""
    records = []
    for run in runs.runs:
        if not run.meta.get("tune") or not best_path(run.path).is_file():
            continue
        try:
            best = read_best(run.path)
        except BestFileError as e:
            raise UserError(f"{run.path}: {e}") from None
        for m, v in best["configs"].items():
            t, d, k = (_positive(v.get(f)) for f in ("time_us", "default_us", "known_us"))
            records.append({"model": best["model"], "dtype": best.get("dtype"), "kernel": best.get("kernel"), "M": m,
                            "time_us": t, "default_us": d, "speedup": d / t, "known_us": k, "vs_known": k / t,
                            "run": run.label})  # NaN stays NaN
    return pd.DataFrame(records, columns=TUNED_COLUMNS)


def _positive(v: object) -> float:
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) and f > 0 else math.nan
