"""Comparing two runs: verdicts against noise, points in one run only, refusals and warnings."""

from __future__ import annotations

import pandas as pd
import pytest

from moebench.errors import UserError
from moebench.report.compare import (
    CHECK_COLUMNS,
    COMPARE_COLUMNS,
    KEY,
    UNMATCHED_COLUMNS,
    check_comparable,
    check_table,
    compare_runs,
    device_mismatch,
    unmatched,
)
from moebench.report.gate import gate

SHAPE = {
    "model": "mixtral-8x7b", "experts": 8, "hidden": 4096, "intermediate": 14336, "topk": 2, "moe_layers": 32,
}


def row(M: int, time_us: float, spread: float = 0.0, **over) -> dict:
    """A result row whose p20/p80 lie ``spread`` apart, relative to the median."""
    r = {
        **SHAPE, "M": M, "dtype": "bf16", "path": "triton", "routing": "uniform", "config": None,
        "status": "ok", "correct": True, "rel_err": 1e-3, "time_us": time_us,
        "time_p20_us": time_us * (1 - spread / 2), "time_p80_us": time_us * (1 + spread / 2),
        "floor_us": None, "pct_of_floor": None, "tflops": 1.0, "gbps": 1.0,
        "device_name": "NVIDIA H200", "interpreter": False,
    }
    r.update(over)
    return r


def frame(*rows: dict) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


def by_M(cmp: pd.DataFrame) -> dict[int, dict]:
    return {r["M"]: r for r in cmp.to_dict("records")}


def test_clear_faster_slower_and_same_points():
    base = frame(row(1, 100.0), row(16, 100.0), row(64, 100.0))
    new = frame(row(1, 80.0), row(16, 120.0), row(64, 101.0))  # -20 %, +20 %, +1 % (inside the 3 % floor)
    cmp = compare_runs(base, new)
    assert list(cmp.columns) == COMPARE_COLUMNS
    got = by_M(cmp)
    assert {m: r["verdict"] for m, r in got.items()} == {1: "FASTER", 16: "SLOWER", 64: "SAME"}
    for r in got.values():
        assert r["ratio"] == pytest.approx(r["new_us"] / r["base_us"])
        assert r["noise"] == pytest.approx(0.03)  # no spread recorded above the threshold
    # what compare --fail-on-slower counts: the one SLOWER point
    assert [line.split(":")[0] for line in gate(base, new, fail_pct=0).regressions] == ["mixtral-8x7b bf16 M=16 triton"]


def test_noise_of_either_run_widens_the_same_band():
    # +8 % is a regression at 3 % noise, but not when the base run's p20..p80 spans 20 % of the median.
    base = frame(row(1, 100.0, spread=0.20), row(2, 100.0, spread=0.01))
    new = frame(row(1, 108.0, spread=0.01), row(2, 108.0, spread=0.05))
    got = by_M(compare_runs(base, new))
    assert got[1]["noise"] == pytest.approx(0.20)
    assert got[1]["verdict"] == "SAME"
    assert got[2]["noise"] == pytest.approx(0.05)  # the larger of the two spreads
    assert got[2]["verdict"] == "SLOWER"


def test_min_threshold_sets_the_floor_of_the_noise():
    base, new = frame(row(1, 100.0)), frame(row(1, 105.0))
    assert compare_runs(base, new, min_threshold=0.03)["verdict"].tolist() == ["SLOWER"]
    assert compare_runs(base, new, min_threshold=0.10)["verdict"].tolist() == ["SAME"]


def test_missing_percentiles_make_the_noise_unknown_not_same():
    """A point whose spread was not recorded has no known noise: UNKNOWN, even for a 10% change."""
    base = frame(row(1, 100.0, time_p20_us=None, time_p80_us=None), row(2, 100.0))
    new = frame(row(1, 90.0), row(2, 100.0))
    got = by_M(compare_runs(base, new))
    assert got[1]["verdict"] == "UNKNOWN" and pd.isna(got[1]["noise"])
    assert got[2]["verdict"] == "SAME"


def test_a_side_of_several_runs_takes_their_median_and_the_spread_between_them():
    """Three baseline runs at 100, 104 and 108 us: the point's time is 104 and its noise at least 8%,
    so 111 us is SAME while one run alone at 100 would call it SLOWER."""
    base = frame(*(row(1, t, spread=0.01, run=f"r{i}") for i, t in enumerate((100.0, 104.0, 108.0))))
    new = frame(row(1, 111.0, spread=0.01))
    r = compare_runs(base, new).iloc[0]
    assert r["base_us"] == pytest.approx(104.0) and r["noise"] == pytest.approx(0.08)
    assert r["verdict"] == "SAME"
    assert compare_runs(base[base["run"] == "r0"], new).iloc[0]["verdict"] == "SLOWER"


def test_interpreter_runs_are_compared_for_correctness_only():
    base = frame(row(1, 100.0, interpreter=True), row(2, 100.0, interpreter=True),
                 row(3, 100.0, interpreter=True, status="incorrect", correct=False))
    new = frame(row(1, 1.0, interpreter=True), row(2, 100.0, interpreter=True, status="incorrect", correct=False),
                row(3, 100.0, interpreter=True))
    got = by_M(check_table(base, new))
    assert [got[m]["verdict"] for m in (1, 2, 3)] == ["CORRECT", "BROKEN", "FIXED"]
    assert list(check_table(base, new).columns) == CHECK_COLUMNS


def test_only_ok_rows_are_compared_and_key_includes_dtype_and_path():
    base = frame(row(1, 100.0), row(1, 100.0, dtype="fp8-tensor"), row(1, 300.0, path="torch"))
    new = frame(
        row(1, 50.0, status="incorrect", correct=False),  # fast but wrong: not a FASTER point
        row(1, 70.0, dtype="fp8-tensor"),
        row(1, 330.0, path="torch"),
    )
    cmp = compare_runs(base, new)
    pairs = {(r["dtype"], r["path"]): r["verdict"] for r in cmp.to_dict("records")}
    assert pairs == {("fp8-tensor", "triton"): "FASTER", ("bf16", "torch"): "SLOWER"}


def test_unmatched_lists_points_of_one_run_only():
    base = frame(row(1, 100.0), row(16, 100.0), row(64, 100.0))
    new = frame(row(16, 100.0), row(64, 100.0, status="error"), row(256, 100.0))
    u = unmatched(base, new)
    assert list(u.columns) == UNMATCHED_COLUMNS
    assert dict(zip(u["M"], u["only_in"], strict=True)) == {1: "base", 64: "base", 256: "new"}
    assert set(compare_runs(base, new)["M"]) == {16}
    assert unmatched(base, base).empty


def test_interpreter_run_is_never_compared_with_a_gpu_run():
    gpu = frame(row(1, 100.0))
    cpu = frame(row(1, 5000.0, interpreter=True, device_name="cpu"))
    with pytest.raises(UserError, match="interpreter"):
        compare_runs(gpu, cpu)
    with pytest.raises(UserError, match="interpreter"):
        compare_runs(cpu, gpu)
    mixed = frame(row(1, 100.0), row(2, 5000.0, interpreter=True))
    with pytest.raises(UserError, match="mixes"):
        compare_runs(mixed, gpu)
    # two interpreter runs may be compared with each other
    assert compare_runs(cpu, cpu)["verdict"].tolist() == ["SAME"]


def test_an_interpreter_run_against_a_gpu_run_is_one_refusal_and_no_warning():
    """The CLI checks comparability first: one line naming what ran where, and no device warning about it."""
    gpu = frame(row(1, 100.0))
    cpu = frame(row(1, 5000.0, interpreter=True, device_name="cpu (x86_64)"))
    for base, new, interp in ((cpu, gpu, "base"), (gpu, cpu, "new")):
        with pytest.raises(UserError) as info:
            check_comparable(base, new)
        msg = str(info.value)
        assert "\n" not in msg and f"the {interp} run used the CPU interpreter" in msg and "NVIDIA H200" in msg
        assert device_mismatch(base, new) is None
    check_comparable(cpu, cpu)
    check_comparable(gpu, frame(row(1, 150.0, device_name="NVIDIA H100 80GB HBM3")))  # two GPUs: a warning only


def test_device_mismatch_is_a_message_not_an_error():
    h200 = frame(row(1, 100.0))
    h100 = frame(row(1, 150.0, device_name="NVIDIA H100 80GB HBM3"))
    assert device_mismatch(h200, h200) is None
    msg = device_mismatch(h200, h100)
    assert "NVIDIA H200" in msg and "NVIDIA H100 80GB HBM3" in msg and "\n" not in msg
    assert compare_runs(h200, h100)["verdict"].tolist() == ["SLOWER"]  # still compared


def test_key_is_the_documented_tuple():
    assert KEY == ("model", "experts", "hidden", "intermediate", "topk", "M", "dtype", "path")
    # a different model shape at the same M is a different point
    base = frame(row(1, 100.0))
    new = frame(row(1, 100.0, hidden=5120))
    assert compare_runs(base, new).empty
    assert sorted(unmatched(base, new)["only_in"]) == ["base", "new"]
