"""The regression gate on real H200 runs: unchanged code passes, a 10% slowdown at one point is caught,
runs of different GPUs or sweeps are refused, and interpreter runs are gated on correctness.

These tests read the committed evidence runs in results/ rather than copies in tests/data: their point is that
`make gate`'s baseline (results/baselines/h200-quick-d62257d) raises no false alarm on the repeat runs of the
same code (results/h200-quick-repeat-d62257d) that docs/reports.md cites."""

from __future__ import annotations

from pathlib import Path

import pytest

from moebench.errors import UserError
from moebench.report import runs
from moebench.report.gate import check_same_problems, gate

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "results" / "baselines" / "h200-quick-d62257d"  # six quick sweeps, two machine starts
REPEATS = sorted(p for p in (ROOT / "results" / "h200-quick-repeat-d62257d").iterdir() if p.is_dir())
DEFAULT_PCT = 5.0  # what `make gate` passes


@pytest.fixture(scope="module")
def baseline():
    return runs.load([BASELINE]).rows


def test_the_baseline_holds_several_runs_of_one_commit(baseline):
    assert baseline["run"].nunique() == 6 and set(baseline["commit"]) == {"d62257d"}
    assert len(REPEATS) == 2


@pytest.mark.parametrize("repeat", REPEATS, ids=lambda p: p.name)
def test_two_runs_of_the_same_code_are_not_flagged(baseline, repeat):
    new = runs.load([repeat]).rows
    result = gate(baseline, new, DEFAULT_PCT)
    assert result.regressions == [] and result.exit_status == 0
    assert len(result.table) == 20


@pytest.mark.parametrize("point", range(20))
def test_a_ten_percent_slowdown_at_one_point_is_caught(baseline, point):
    """Each point of a real repeat run, in turn, made 10% slower: the gate names that point and no other,
    unless the point's own measured noise is wider than 10% (then nothing is flagged)."""
    new = runs.load([REPEATS[0]]).rows.sort_values(["model", "M", "path"]).reset_index(drop=True)
    slowed = new.copy()
    slowed.loc[point, ["time_us", "time_p20_us", "time_p80_us"]] *= 1.10
    result = gate(baseline, slowed, DEFAULT_PCT)
    r = new.loc[point]
    hit = result.table[(result.table["M"] == r["M"]) & (result.table["path"] == r["path"])
                       & (result.table["model"] == r["model"])].iloc[0]
    if hit["ratio"] > 1 + max(hit["noise"], DEFAULT_PCT / 100):
        (line,) = result.regressions
        assert f"{r['model']} bf16 M={r['M']} {r['path']}" in line and result.exit_status == 1
    else:
        assert result.regressions == []
    assert hit["ratio"] > 1.05  # the injected slowdown is seen


def test_most_injected_slowdowns_are_caught(baseline):
    new = runs.load([REPEATS[0]]).rows
    caught = 0
    for i in range(len(new)):
        slowed = new.copy()
        slowed.loc[i, "time_us"] *= 1.10
        caught += gate(baseline, slowed, DEFAULT_PCT).exit_status
    assert caught >= 0.9 * len(new)


@pytest.mark.parametrize("repeat", REPEATS, ids=lambda p: p.name)
def test_a_baseline_of_the_same_code_is_not_called_stale(baseline, repeat):
    assert gate(baseline, runs.load([repeat]).rows, DEFAULT_PCT).stale == []


@pytest.mark.parametrize("point", [0, 7, 19])  # a decode, a middle and a prefill point of the sorted run
def test_a_point_faster_than_the_baseline_beyond_noise_is_named_stale_and_passes(baseline, point):
    """A point 20% faster than the baseline (the code has outrun it): the gate passes but names that point
    alone as stale, since a regression there of up to the gain would pass unseen."""
    new = runs.load([REPEATS[0]]).rows.sort_values(["model", "M", "path"]).reset_index(drop=True)
    faster = new.copy()
    faster.loc[point, ["time_us", "time_p20_us", "time_p80_us"]] *= 0.80
    result = gate(baseline, faster, DEFAULT_PCT)
    r = new.loc[point]
    (line,) = result.stale
    assert line.startswith(f"{r['model']} bf16 M={r['M']} {r['path']}:") and result.exit_status == 0


def test_a_point_that_fails_now_is_a_regression(baseline):
    new = runs.load([REPEATS[0]]).rows
    new.loc[0, ["status", "time_us"]] = ["incorrect", None]
    result = gate(baseline, new, DEFAULT_PCT)
    assert result.exit_status == 1 and "incorrect now" in result.regressions[0]


def test_runs_of_another_gpu_or_another_sweep_are_refused(baseline):
    new = runs.load([REPEATS[0]]).rows
    with pytest.raises(UserError, match="NVIDIA H100"):
        check_same_problems(baseline, new.assign(device_name="NVIDIA H100"))
    with pytest.raises(UserError, match="lacks 10 point"):
        check_same_problems(baseline, new[new["model"] == "mixtral-8x7b"])
    with pytest.raises(UserError, match="share no point"):
        check_same_problems(baseline, new.assign(model="other"))
    with pytest.raises(UserError, match="interpreter"):
        gate(baseline, new.assign(interpreter=True), DEFAULT_PCT)


def test_interpreter_runs_are_gated_on_correctness(baseline):
    cpu = baseline[baseline["run"] == baseline["run"].iloc[0]].assign(interpreter=True, device_name="cpu")
    broken = cpu.copy()
    broken.loc[broken.index[0], "status"] = "incorrect"
    assert gate(cpu, cpu.assign(time_us=cpu["time_us"] * 3), DEFAULT_PCT).exit_status == 0  # no speed verdict
    result = gate(cpu, broken, DEFAULT_PCT)
    assert result.exit_status == 1 and "incorrect now" in result.regressions[0]


def test_make_gate_and_the_workflow_example_use_the_committed_baseline():
    """The Makefile's gate compares against a baseline that exists and loads; the example workflow runs it."""
    import yaml

    makefile = (ROOT / "Makefile").read_text()
    (line,) = [x for x in makefile.splitlines() if x.startswith("BASELINE ?=")]
    assert ROOT / line.split("?=")[1].strip() == BASELINE
    assert "--fail-slower $(GATE_PCT)" in makefile
    steps = yaml.safe_load((ROOT / "docs" / "ci" / "h200-gate.yml").read_text())["jobs"]["gate"]["steps"]
    assert any("make gate" in step.get("run", "") for step in steps)
