"""The regression gate: a current run against a baseline, exit 1 on a regression, 2 on runs that differ.

A regression is a point slower than the baseline by more than ``fail_pct`` percent and beyond the
measured noise (``moebench.report.compare``), or a point ok in the baseline that failed in the current run
(incorrect, error). CPU-interpreter runs are gated on correctness only. Runs from different GPUs, or a
current run that lacks points of the baseline, are not comparable: a UserError that says so.

A point FASTER than the baseline beyond the noise is no failure but a sign the baseline is stale: the code
has outrun it, so a regression there of up to the gain passes unseen. ``stale`` names those points, and the
command warns (docs/reports.md: refreshing the baseline).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from moebench.errors import UserError
from moebench.report.compare import (
    KEY,
    check_comparable,
    check_table,
    compare_runs,
    devices,
    is_interpreter,
    point_label,
    point_times,
)


@dataclass(frozen=True)
class GateResult:
    table: pd.DataFrame  # compare_runs' table (GPU) or check_table's (interpreter)
    regressions: list[str]  # one line per regressed point: what and by how much
    stale: list[str] = ()  # one line per point FASTER than the baseline beyond noise: the baseline is behind

    @property
    def exit_status(self) -> int:
        return 1 if self.regressions else 0


def _points(df: pd.DataFrame) -> set[tuple]:
    ran = df[df["status"] != "unsupported"]
    return set(ran[list(KEY)].itertuples(index=False, name=None))


def check_same_problems(base: pd.DataFrame, new: pd.DataFrame) -> None:
    """UserError where the runs ran on different GPUs or the current run lacks points of the baseline."""
    check_comparable(base, new)
    b_dev, n_dev = devices(base), devices(new)
    if not is_interpreter(base) and b_dev and n_dev and b_dev != n_dev:
        raise UserError(f"the baseline ran on {', '.join(b_dev)} and the current run on {', '.join(n_dev)}: "
                        "a gate compares runs of one GPU model")
    b, n = _points(base), _points(new)
    if not b & n:
        raise UserError("the baseline and the current run share no point: they are different sweeps")
    if missing := sorted(b - n, key=str):
        first = point_label(dict(zip(KEY, missing[0])))
        raise UserError(f"the current run lacks {len(missing)} point(s) of the baseline (first: {first}): "
                        "run the baseline's sweep")


def gate(base: pd.DataFrame, new: pd.DataFrame, fail_pct: float, min_threshold: float = 0.03) -> GateResult:
    """The regressions of ``new`` against ``base`` (see the module docstring)."""
    if fail_pct < 0:
        raise UserError(f"--fail-slower {fail_pct}: a percentage >= 0")
    check_same_problems(base, new)
    if is_interpreter(base):
        table = check_table(base, new)
        broken = table[table["verdict"] == "BROKEN"]
        return GateResult(table, [f"{point_label(r)}: correct in the baseline, incorrect now"
                                  for r in broken.to_dict("records")])
    table = compare_runs(base, new, min_threshold=min_threshold)
    slow = table[(table["verdict"] == "SLOWER") & (table["ratio"] > 1 + fail_pct / 100)]
    lines = [f"{point_label(r)}: {r['ratio']:.3f}x the baseline's time ({r['base_us']:.1f} -> {r['new_us']:.1f} us, "
             f"noise ±{100 * r['noise']:.1f}%)" for r in slow.to_dict("records")]
    fast = table[table["verdict"] == "FASTER"]
    stale = [f"{point_label(r)}: {r['ratio']:.3f}x the baseline's time (noise ±{100 * r['noise']:.1f}%)"
             for r in fast.to_dict("records")]
    timed = point_times(new, list(KEY))[list(KEY)]
    ok_before = point_times(base, list(KEY))[list(KEY)]
    lost = ok_before.merge(timed, on=list(KEY), how="left", indicator=True)
    lost = lost[lost["_merge"] == "left_only"]
    status = new.drop_duplicates(list(KEY), keep="last").set_index(list(KEY))["status"]
    for r in lost.to_dict("records"):
        key = tuple(r[k] for k in KEY)
        lines.append(f"{point_label(r)}: ok in the baseline, {status.get(key, 'missing')} now")
    return GateResult(table, lines, stale)
