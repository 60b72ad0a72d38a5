"""Two runs side by side: FASTER / SLOWER / SAME at each point, judged against both runs' measured noise.

Made for people (render the table with ``moebench.report.render``) and for a CI
gate (``count_slower`` is the number of regressions; the CLI turns it into the
exit status). Timings from the CPU interpreter are never compared with GPU
timings; a different GPU is allowed but reported (``device_mismatch``).
"""

from __future__ import annotations

import pandas as pd

from moebench.errors import UserError

KEY = ("model", "experts", "hidden", "intermediate", "topk", "M", "dtype", "path")
COMPARE_COLUMNS = [*KEY, "base_us", "new_us", "ratio", "noise", "verdict"]
UNMATCHED_COLUMNS = [*KEY, "only_in"]


def _interpreter_flags(df: pd.DataFrame) -> pd.Series:
    if "interpreter" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["interpreter"].map(lambda v: bool(v) if v is not None and not pd.isna(v) else False)


def _run_kind(df: pd.DataFrame, label: str) -> str | None:
    """'interpreter', 'gpu', or None for a run with no rows; a run that mixes both is a UserError."""
    flags = _interpreter_flags(df)
    if flags.empty:
        return None
    if flags.all():
        return "interpreter"
    if not flags.any():
        return "gpu"
    raise UserError(f"the {label} run mixes CPU-interpreter rows with GPU rows; split it before comparing")


def check_comparable(base: pd.DataFrame, new: pd.DataFrame) -> None:
    """Refuse (UserError, one line) to compare CPU-interpreter timings with GPU timings.

    Called before anything else is said about the two runs, so no warning about their
    devices comes first.
    """
    kinds = {"base": _run_kind(base, "base"), "new": _run_kind(new, "new")}
    if None not in kinds.values() and kinds["base"] != kinds["new"]:
        interp, gpu = ("base", "new") if kinds["base"] == "interpreter" else ("new", "base")
        gpu_names = ", ".join(_devices(new if gpu == "new" else base)) or "a GPU"
        raise UserError(
            f"cannot compare speed: the {interp} run used the CPU interpreter and the {gpu} run {gpu_names}; "
            "interpreter timings are not GPU performance"
        )


def _devices(df: pd.DataFrame) -> list[str]:
    if "device_name" not in df.columns:
        return []
    return sorted({str(d) for d in df["device_name"] if d is not None and not pd.isna(d)})


def device_mismatch(base: pd.DataFrame, new: pd.DataFrame) -> str | None:
    """A one-line warning when the runs ran on different GPUs, else None (nothing is printed).

    An interpreter run set against a GPU run is ``check_comparable``'s refusal, not a warning.
    """
    if {_run_kind(base, "base"), _run_kind(new, "new")} == {"interpreter", "gpu"}:
        return None
    b, n = _devices(base), _devices(new)
    if not b or not n or b == n:
        return None
    return (
        f"base ran on {', '.join(b)} and new on {', '.join(n)}: "
        "absolute times differ across devices, compare % of floor instead"
    )


def _timed_points(df: pd.DataFrame) -> pd.DataFrame:
    """Status-ok, timed rows, one per KEY: the fastest where a run holds several (tile configs, routings)."""
    ok = df[(df["status"] == "ok") & df["time_us"].notna()]
    ok = ok.sort_values("time_us", kind="stable")
    return ok.drop_duplicates(subset=list(KEY), keep="first")


def _relative_spread(df: pd.DataFrame) -> pd.Series:
    """(p80 - p20) / median per row; 0 where the percentiles were not recorded."""
    if "time_p20_us" not in df.columns or "time_p80_us" not in df.columns:
        return pd.Series(0.0, index=df.index)
    p20 = pd.to_numeric(df["time_p20_us"], errors="coerce")
    p80 = pd.to_numeric(df["time_p80_us"], errors="coerce")
    return ((p80 - p20) / df["time_us"].astype(float)).fillna(0.0).clip(lower=0.0)


def compare_runs(base: pd.DataFrame, new: pd.DataFrame, min_threshold: float = 0.03) -> pd.DataFrame:
    """Join the two runs' ok points on KEY and give each a verdict.

    ``ratio = new_us / base_us``; ``noise`` is the larger of the two runs'
    relative spreads ``(p80 - p20) / median`` at that point, and at least
    ``min_threshold``. FASTER if ``ratio < 1 - noise``, SLOWER if
    ``ratio > 1 + noise``, else SAME.
    """
    if min_threshold < 0:
        raise UserError(f"noise threshold {min_threshold} must be >= 0")
    check_comparable(base, new)
    key = list(KEY)
    b = _timed_points(base)
    n = _timed_points(new)
    b = b[key].assign(base_us=b["time_us"].astype(float), _base_noise=_relative_spread(b))
    n = n[key].assign(new_us=n["time_us"].astype(float), _new_noise=_relative_spread(n))
    cmp = b.merge(n, on=key, how="inner")
    cmp["ratio"] = cmp["new_us"] / cmp["base_us"]
    spread = cmp[["_base_noise", "_new_noise"]].max(axis=1)
    cmp["noise"] = spread.clip(lower=min_threshold)
    cmp["verdict"] = "SAME"
    cmp.loc[cmp["ratio"] < 1 - cmp["noise"], "verdict"] = "FASTER"
    cmp.loc[cmp["ratio"] > 1 + cmp["noise"], "verdict"] = "SLOWER"
    return cmp.sort_values(key, kind="stable")[COMPARE_COLUMNS].reset_index(drop=True)


def unmatched(base: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Points with an ok timing in only one run; ``only_in`` says which ("base" or "new").

    A point that failed (incorrect, error, unsupported) in one run shows up here
    as present only in the other.
    """
    key = list(KEY)
    b = _timed_points(base)[key]
    n = _timed_points(new)[key]
    both = b.merge(n, on=key, how="outer", indicator=True)
    side = both["_merge"].map({"left_only": "base", "right_only": "new", "both": None})
    out = both.assign(only_in=side.astype(object))
    out = out[out["only_in"].notna()]
    return out.sort_values(key, kind="stable")[UNMATCHED_COLUMNS].reset_index(drop=True)


def count_slower(cmp: pd.DataFrame) -> int:
    """How many points regressed: the exit status of a CI gate."""
    return int((cmp["verdict"] == "SLOWER").sum())
