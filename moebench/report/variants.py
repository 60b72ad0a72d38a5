"""Variants of the same point within a run, side by side: paths, dtypes, or Swap-AB on and off.

``compare_within(rows, by)`` groups a run's rows by point with ``by`` taken out of the point, and sets
each variant against a base variant (cutlass, bf16, Swap-AB off unless told otherwise): the speed-up
``base_us / variant_us`` (> 1: the variant is faster) and a verdict against both variants' noise, as
``moebench.report.compare`` judges two runs. CPU-interpreter rows get a correctness table instead.
"""

from __future__ import annotations

import pandas as pd

from moebench.errors import UserError
from moebench.report.compare import (
    KEY,
    check_verdicts,
    combined_noise,
    is_interpreter,
    judge,
    point_correct,
    point_times,
)

# What can be compared, and the variant the others are set against by default.
BY_DEFAULT_BASE = {"path": "cutlass", "dtype": "bf16", "swap_ab": "off"}


def _variant(df: pd.DataFrame, by: str) -> pd.Series:
    if by != "swap_ab":
        return df[by].astype(str)
    swap = df["config"].map(lambda c: (("on" if c.get("swap_ab") else "off") if isinstance(c, dict) else None))
    return swap


def point_columns(by: str) -> list[str]:
    """The columns that name a point when ``by`` varies within it."""
    return [c for c in KEY if c != by]


def compare_within(df: pd.DataFrame, by: str, base: str | None = None, min_threshold: float = 0.03) -> pd.DataFrame:
    """Each variant of ``by`` against the ``base`` variant at every point where both ran.

    GPU rows: ``[*point, base, variant, base_us, variant_us, speedup, noise, verdict]``; interpreter
    rows: ``[*point, base, variant, base_correct, variant_correct, verdict]`` (CORRECT / BROKEN / FIXED /
    INCORRECT, the variant against the base). UserError for an unknown ``by``, a base no row has, or a run
    where no point ran both the base and another variant (nothing to pair).
    """
    if by not in BY_DEFAULT_BASE:
        raise UserError(f"cannot compare by {by!r}; choose one of: {', '.join(BY_DEFAULT_BASE)}")
    base = str(base if base is not None else BY_DEFAULT_BASE[by])
    rows = df.assign(_variant=_variant(df, by))
    rows = rows[rows["_variant"].notna()]
    values = sorted(set(rows["_variant"]))
    if base not in values:
        raise UserError(f"no {by} {base!r} rows to compare against; {by} in this run: {', '.join(values) or 'none'}")
    if len(values) < 2:
        raise UserError(f"every row has {by} {base!r}: nothing to compare it with")
    point = point_columns(by)
    group = [*point, "_variant"]
    if is_interpreter(rows):
        table = _check_within(rows, point, group, base)
    else:
        table = _time_within(rows, point, group, base, min_threshold)
    if table.empty:
        others = " or ".join(repr(v) for v in values if v != base)
        raise UserError(f"no point of this run has both {by} {base!r} and {by} {others}: nothing to pair")
    return table


def _time_within(rows: pd.DataFrame, point: list[str], group: list[str], base: str,
                 min_threshold: float) -> pd.DataFrame:
    times = point_times(rows, group)
    b = times[times["_variant"] == base].drop(columns="_variant")
    v = times[times["_variant"] != base].rename(columns={"_variant": "variant"})
    out = v.merge(b, on=point, how="inner", suffixes=("_v", "_b"))
    side = {s: out[[f"within_{s}", f"between_{s}"]].set_axis(["within", "between"], axis=1) for s in ("b", "v")}
    out = out.assign(base=base, base_us=out["time_us_b"], variant_us=out["time_us_v"])
    out["speedup"] = out["base_us"] / out["variant_us"]
    out["noise"] = combined_noise(side["b"], side["v"], min_threshold)
    out["verdict"] = judge(out["variant_us"] / out["base_us"], out["noise"])
    columns = [*point, "base", "variant", "base_us", "variant_us", "speedup", "noise", "verdict"]
    return out.sort_values([*point, "variant"], kind="stable")[columns].reset_index(drop=True)


def _check_within(rows: pd.DataFrame, point: list[str], group: list[str], base: str) -> pd.DataFrame:
    good = point_correct(rows, group)
    b = good[good["_variant"] == base].drop(columns="_variant")
    v = good[good["_variant"] != base].rename(columns={"_variant": "variant"})
    out = v.merge(b, on=point, how="inner", suffixes=("_v", "_b")).assign(base=base)
    out["base_correct"], out["variant_correct"] = out["correct_b"].astype(bool), out["correct_v"].astype(bool)
    out["verdict"] = check_verdicts(out["base_correct"], out["variant_correct"])
    columns = [*point, "base", "variant", "base_correct", "variant_correct", "verdict"]
    return out.sort_values([*point, "variant"], kind="stable")[columns].reset_index(drop=True)
