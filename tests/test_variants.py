"""Variants within a run (`compare RUN --by`): paths, dtypes and Swap-AB side by side on real H200 rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from moebench.errors import UserError
from moebench.report import runs
from moebench.report.compare import point_times
from moebench.report.variants import compare_within, point_columns

DATA = Path(__file__).resolve().parent / "data"
KERNELS = DATA / "h200-kernels"  # triton and cutlass, bf16 and fp8, one row per point and path
SWAP = DATA / "h200-fp8-static"  # triton rows with Swap-AB on and off at every M (the 3 fastest of each)


@pytest.fixture(scope="module")
def kernels():
    return runs.load([KERNELS]).rows


def test_by_path_sets_triton_against_cutlass_where_both_ran(kernels):
    table = compare_within(kernels, "path")
    times = point_times(kernels, [*point_columns("path"), "path"])
    both = times.groupby(point_columns("path"))["path"].nunique()
    assert len(table) == int((both == 2).sum()) > 0  # only points where cutlass and triton both ran
    assert set(table["base"]) == {"cutlass"} and set(table["variant"]) == {"triton"}
    r = table.iloc[0]
    at = times.set_index([*point_columns("path"), "path"])["time_us"]
    point = tuple(r[c] for c in point_columns("path"))
    assert r["speedup"] == pytest.approx(at[(*point, "cutlass")] / at[(*point, "triton")])
    assert (table.loc[table["speedup"] > 1 + table["noise"], "verdict"] == "FASTER").all()


def test_by_dtype_sets_fp8_against_bf16_of_the_same_model_m_and_path(kernels):
    table = compare_within(kernels, "dtype")
    assert set(table["base"]) == {"bf16"} and set(table["variant"]) <= {"fp8-tensor", "fp8-block128"}
    assert "dtype" not in table.columns and {"model", "M", "path"} <= set(table.columns)


def test_by_swap_ab_compares_the_fastest_row_of_each_setting():
    rows = runs.load([SWAP]).rows
    table = compare_within(rows, "swap_ab")
    assert set(table["base"]) == {"off"} and set(table["variant"]) == {"on"}
    triton = rows[(rows["path"] == "triton") & (rows["status"] == "ok")]
    swap = triton["config"].map(lambda c: bool(c["swap_ab"]))
    m1 = table[table["M"] == 1].iloc[0]
    assert m1["base_us"] == pytest.approx(triton[~swap & (triton["M"] == 1)]["time_us"].min())
    assert m1["variant_us"] == pytest.approx(triton[swap & (triton["M"] == 1)]["time_us"].min())


def test_missing_noise_is_unknown(kernels):
    rows = kernels.assign(time_p20_us=None)
    assert set(compare_within(rows, "path")["verdict"]) == {"UNKNOWN"}


@pytest.mark.parametrize("by, base, message", [
    ("routing", None, "cannot compare by"),
    ("path", "torch", "no path 'torch' rows"),
])
def test_bad_requests_are_user_errors(kernels, by, base, message):
    with pytest.raises(UserError, match=message):
        compare_within(kernels, by, base)


def test_a_run_with_one_variant_only_is_refused(kernels):
    with pytest.raises(UserError, match="nothing to compare"):
        compare_within(kernels[kernels["path"] == "cutlass"], "path")


def test_interpreter_rows_get_correctness_not_speed(kernels):
    rows = kernels.assign(interpreter=True)
    bad = rows.index[(rows["path"] == "triton") & (rows["status"] == "ok")][0]
    rows.loc[bad, "status"] = "incorrect"
    table = compare_within(rows, "path")
    assert "speedup" not in table.columns
    assert set(table["verdict"]) == {"CORRECT", "BROKEN"} and (table["verdict"] == "BROKEN").sum() == 1


def test_by_swap_ab_on_a_run_without_pairs_is_one_line_exit_2():
    """h200-kernels has Swap-AB on and off rows but never at the same point: `compare --by swap_ab` says so in
    one line and exits 2, as for a run with one variant only, instead of an empty table "against None"."""
    from helpers import moebench_in_process

    proc = moebench_in_process("compare", str(KERNELS), "--by", "swap_ab")
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert "no point of this run has both swap_ab 'off' and swap_ab 'on'" in line
