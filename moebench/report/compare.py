"""Two sides side by side: FASTER / SLOWER / SAME / UNKNOWN at each point, judged against the measured noise.

A side is the rows of one run or of several runs of the same sweep (a baseline folder); ``run`` names
each row's run. Per point, a side's time is the median over its runs of each run's fastest ok row, and
its noise is the larger of the spread within a run, ``(p80 - p20) / median``, and the spread between its
runs, ``max / min - 1``: a baseline of runs made on more than one machine carries the run-to-run and
machine-to-machine noise a CI gate meets (docs/reports.md). A point with no recorded spread has no known
noise: its verdict is UNKNOWN, never SAME.

CPU-interpreter runs are compared for correctness only (``check_table``): their timings are not GPU
performance. The regression gate (``gate``) exits 1 on points slower beyond a percentage and beyond
noise, or ok in the base and failed in the new run; runs of different GPUs or problems are a UserError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from moebench.errors import UserError
from moebench.report.tables import interpreter_rows

KEY = ("model", "experts", "hidden", "intermediate", "topk", "M", "dtype", "path")
COMPARE_COLUMNS = [*KEY, "base_us", "new_us", "ratio", "noise", "verdict"]
CHECK_COLUMNS = [*KEY, "base_correct", "new_correct", "verdict"]
UNMATCHED_COLUMNS = [*KEY, "only_in"]
# Correctness verdicts of interpreter runs: new against base.
CHECK_VERDICTS = {(True, True): "CORRECT", (True, False): "BROKEN", (False, True): "FIXED",
                  (False, False): "INCORRECT"}


def _run_kind(df: pd.DataFrame, label: str) -> str | None:
    """'interpreter', 'gpu', or None for a run with no rows; a run that mixes both is a UserError."""
    flags = interpreter_rows(df)
    if flags.empty:
        return None
    if flags.all():
        return "interpreter"
    if not flags.any():
        return "gpu"
    raise UserError(f"the {label} run mixes CPU-interpreter rows with GPU rows; split it before comparing")


def is_interpreter(df: pd.DataFrame) -> bool:
    """True when every row of ``df`` (at least one) came from the interpreter."""
    return _run_kind(df, "compared") == "interpreter"


def check_comparable(base: pd.DataFrame, new: pd.DataFrame) -> None:
    """Refuse (UserError, one line) to compare CPU-interpreter timings with GPU timings.

    Called before anything else is said about the two runs, so no warning about their
    devices comes first.
    """
    kinds = {"base": _run_kind(base, "base"), "new": _run_kind(new, "new")}
    if None not in kinds.values() and kinds["base"] != kinds["new"]:
        interp, gpu = ("base", "new") if kinds["base"] == "interpreter" else ("new", "base")
        gpu_names = ", ".join(devices(new if gpu == "new" else base)) or "a GPU"
        raise UserError(
            f"cannot compare speed: the {interp} run used the CPU interpreter and the {gpu} run {gpu_names}; "
            "interpreter timings are not GPU performance"
        )


def devices(df: pd.DataFrame) -> list[str]:
    """The device names the rows ran on, sorted."""
    if "device_name" not in df.columns:
        return []
    return sorted({str(d) for d in df["device_name"] if d is not None and not pd.isna(d)})


def device_mismatch(base: pd.DataFrame, new: pd.DataFrame) -> str | None:
    """A one-line warning when the runs ran on different GPUs, else None (nothing is printed).

    An interpreter run set against a GPU run is ``check_comparable``'s refusal, not a warning.
    """
    if {_run_kind(base, "base"), _run_kind(new, "new")} == {"interpreter", "gpu"}:
        return None
    b, n = devices(base), devices(new)
    if not b or not n or b == n:
        return None
    return (
        f"base ran on {', '.join(b)} and new on {', '.join(n)}: "
        "absolute times differ across devices, compare % of floor instead"
    )


def _runs_column(df: pd.DataFrame) -> pd.Series:
    return df["run"].astype(str) if "run" in df.columns else pd.Series("run", index=df.index)


def relative_spread(df: pd.DataFrame) -> pd.Series:
    """(p80 - p20) / median per row; NaN where the percentiles were not recorded (noise unknown)."""
    if "time_p20_us" not in df.columns or "time_p80_us" not in df.columns:
        return pd.Series(np.nan, index=df.index)
    p20 = pd.to_numeric(df["time_p20_us"], errors="coerce")
    p80 = pd.to_numeric(df["time_p80_us"], errors="coerce")
    return ((p80 - p20) / pd.to_numeric(df["time_us"], errors="coerce")).clip(lower=0.0)


def point_times(df: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """Per ``key``: ``time_us`` (median over the runs of each run's fastest ok row), ``within`` (the largest
    spread within a run, NaN if none was recorded), ``between`` (max / min - 1 over the runs; 0 for one run)
    and ``runs`` (how many runs timed it)."""
    ok = df[(df["status"] == "ok") & pd.to_numeric(df["time_us"], errors="coerce").notna()]
    ok = ok.assign(_run=_runs_column(ok), time_us=ok["time_us"].astype(float), _spread=relative_spread(ok))
    ok = ok.sort_values("time_us", kind="stable").drop_duplicates([*key, "_run"], keep="first")
    if ok.empty:
        return pd.DataFrame(columns=[*key, "time_us", "within", "between", "runs"])
    g = ok.groupby(key, sort=False, dropna=False)
    out = pd.DataFrame({
        "time_us": g["time_us"].median(),
        "within": g["_spread"].max(),
        "between": g["time_us"].max() / g["time_us"].min() - 1.0,
        "runs": g["_run"].nunique(),
    })
    return out.reset_index()


def judge(ratio: pd.Series, noise: pd.Series) -> pd.Series:
    """FASTER if ``ratio < 1 - noise``, SLOWER if ``ratio > 1 + noise``, SAME between, UNKNOWN where the
    noise is NaN (not measured)."""
    verdict = pd.Series("SAME", index=ratio.index, dtype=object)
    verdict[ratio < 1 - noise] = "FASTER"
    verdict[ratio > 1 + noise] = "SLOWER"
    verdict[noise.isna()] = "UNKNOWN"
    return verdict


def combined_noise(a: pd.DataFrame, b: pd.DataFrame, min_threshold: float) -> pd.Series:
    """The band of two sides' ``point_times`` (aligned): the largest spread within or between runs of
    either, at least ``min_threshold``; NaN where either side recorded no spread within its runs."""
    known = a["within"].notna() & b["within"].notna()
    band = pd.concat([a["within"], b["within"], a["between"], b["between"]], axis=1).max(axis=1)
    return band.clip(lower=min_threshold).where(known)


def compare_runs(base: pd.DataFrame, new: pd.DataFrame, min_threshold: float = 0.03,
                 key: Sequence[str] = KEY) -> pd.DataFrame:
    """Join the two sides' ok points on ``key`` (a sweep's KEY, or a step's point and path) and give each a
    verdict (``judge``).

    ``ratio = new_us / base_us``; ``noise`` is ``combined_noise`` of the two sides at that point.
    """
    if not 0 <= min_threshold < math.inf:  # nan too
        raise UserError(f"noise threshold {min_threshold} must be a finite number >= 0")
    check_comparable(base, new)
    key = list(key)
    cmp = point_times(base, key).merge(point_times(new, key), on=key, how="inner", suffixes=("_b", "_n"))
    side = {s: cmp[[f"{c}_{s}" for c in ("within", "between")]].set_axis(["within", "between"], axis=1)
            for s in ("b", "n")}
    cmp["base_us"], cmp["new_us"] = cmp["time_us_b"], cmp["time_us_n"]
    cmp["ratio"] = cmp["new_us"] / cmp["base_us"]
    cmp["noise"] = combined_noise(side["b"], side["n"], min_threshold)
    cmp["verdict"] = judge(cmp["ratio"], cmp["noise"])
    columns = [*key, *COMPARE_COLUMNS[len(KEY):]]
    return cmp.sort_values(key, kind="stable")[columns].reset_index(drop=True)


def point_correct(df: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """Per ``key``: ``correct``, True where every checked row of the point (status ok or incorrect) passed."""
    checked = df[df["status"].isin(["ok", "incorrect"])]
    if checked.empty:
        return pd.DataFrame(columns=[*key, "correct"])
    good = checked["status"] == "ok"
    return good.groupby([checked[k] for k in key], sort=False).all().rename("correct").reset_index()


def check_verdicts(base_correct, new_correct) -> list[str]:
    """CHECK_VERDICTS of each pair: whether the base passed its check, whether the new (or variant) did."""
    return [CHECK_VERDICTS[(bool(b), bool(n))] for b, n in zip(base_correct, new_correct)]


def check_table(base: pd.DataFrame, new: pd.DataFrame, key: Sequence[str] = KEY) -> pd.DataFrame:
    """Interpreter runs: per point (``key``) both ran, whether each side passed its check and a verdict
    (CHECK_VERDICTS: CORRECT, BROKEN, FIXED, INCORRECT). No speed is compared."""
    key = list(key)
    b, n = point_correct(base, key), point_correct(new, key)
    out = b.merge(n, on=key, how="inner", suffixes=("_b", "_n"))
    out["base_correct"], out["new_correct"] = out["correct_b"].astype(bool), out["correct_n"].astype(bool)
    out["verdict"] = check_verdicts(out["base_correct"], out["new_correct"])
    return out.sort_values(key, kind="stable")[[*key, *CHECK_COLUMNS[len(KEY):]]].reset_index(drop=True)


def unmatched(base: pd.DataFrame, new: pd.DataFrame, key: Sequence[str] = KEY) -> pd.DataFrame:
    """Points (``key``) with an ok timing in only one run; ``only_in`` says which ("base" or "new").

    A point that failed (incorrect, error, unsupported) in one run shows up here
    as present only in the other.
    """
    key = list(key)
    b = point_times(base, key)[key]
    n = point_times(new, key)[key]
    both = b.merge(n, on=key, how="outer", indicator=True)
    side = both["_merge"].map({"left_only": "base", "right_only": "new", "both": None})
    out = both.assign(only_in=side.astype(object))
    out = out[out["only_in"].notna()]
    return out.sort_values(key, kind="stable")[[*key, "only_in"]].reset_index(drop=True)


def point_label(r) -> str:
    """A point as one short phrase: 'mixtral-8x7b bf16 M=16 cutlass'."""
    return f"{r['model']} {r['dtype']} M={r['M']} {r['path']}"
