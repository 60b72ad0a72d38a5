"""The gate's percentage (``report.gate.gate``, ``moebench compare BASE NEW --fail-slower PCT``): a point SLOWER
beyond the noise fails the gate only where it is also more than PCT percent slower; a smaller slowdown is
reported (verdict SLOWER) and passes."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from helpers import moebench_in_process

from moebench.report.gate import gate

ROOT = Path(__file__).resolve().parent.parent
GPU_RUN = ROOT / "tests" / "data" / "h200-quick"  # a run folder from an H200: 20 points
SHAPE = {"model": "mixtral-8x7b", "experts": 8, "hidden": 4096, "intermediate": 14336, "topk": 2, "moe_layers": 32}
NOISE = 0.01  # the noise floor the tests set (min_threshold / --threshold): below each slowdown tried


def row(M: int, time_us: float) -> dict:
    """An ok GPU row at M whose p20 and p80 lie 1% apart (the noise both runs measured)."""
    return {**SHAPE, "M": M, "dtype": "bf16", "path": "triton", "routing": "uniform", "config": None,
            "status": "ok", "correct": True, "rel_err": 1e-3, "time_us": time_us, "time_p20_us": time_us * 0.995,
            "time_p80_us": time_us * 1.005, "device_name": "NVIDIA H200", "interpreter": False}


BASE = pd.DataFrame([row(1, 100.0), row(16, 100.0), row(64, 100.0)])


# (slowdown at M=1, 16, 64; --fail-slower; the M that fail, why)
CASES = [
    pytest.param((1.03, 1.07, 1.0), 5.0, [16], id="3%-passes-7%-fails-at-5%"),
    pytest.param((1.03, 1.04, 1.0), 5.0, [], id="slower-beyond-noise-under-5%-passes"),
    pytest.param((1.03, 1.07, 1.0), 10.0, [], id="both-under-10%"),
    pytest.param((1.03, 1.07, 1.0), 2.0, [1, 16], id="both-over-2%"),
    pytest.param((1.03, 1.07, 1.0), 0.0, [1, 16], id="0%-fails-every-slower-point"),
    pytest.param((1.12, 1.07, 1.0), 10.0, [1], id="only-the-one-over-10%"),
]


@pytest.mark.parametrize("slowdown, pct, failing", CASES)
def test_a_slower_point_fails_the_gate_only_beyond_the_percentage(slowdown, pct, failing):
    """Every slowed point is SLOWER (beyond the 1% noise); those more than ``pct`` percent slower, and only
    those, are regressions, and the exit status is 1 exactly where one is."""
    new = pd.DataFrame([row(M, 100.0 * s) for M, s in zip((1, 16, 64), slowdown)])
    result = gate(BASE, new, pct, min_threshold=NOISE)
    verdicts = dict(zip(result.table["M"], result.table["verdict"]))
    assert verdicts == {M: "SLOWER" if s > 1 else "SAME" for M, s in zip((1, 16, 64), slowdown)}  # precondition
    assert [line.split(":")[0] for line in result.regressions] == [f"mixtral-8x7b bf16 M={M} triton" for M in failing]
    assert result.exit_status == (1 if failing else 0)


def _copy_run(src: Path, dst: Path, scale: dict[tuple, float]) -> Path:
    """``src`` copied to ``dst`` with each row's spread set to none (the noise is then --threshold's) and the
    times of the points ``scale`` names ((model, M, path) -> factor) multiplied."""
    shutil.copytree(src, dst)
    rows = [json.loads(line) for line in (dst / "rows.jsonl").read_text().splitlines()]
    for r in rows:
        if r["status"] == "ok":
            t = r["time_us"] * scale.get((r["model"], r["M"], r["path"]), 1.0)
            r.update(time_us=t, time_p20_us=t, time_p80_us=t)
    (dst / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    return _copy_run(GPU_RUN, tmp_path_factory.mktemp("gate") / "base", {})


@pytest.mark.parametrize("slowdown, failing", [
    pytest.param({("mixtral-8x7b", 1, "triton"): 1.04}, [], id="4%-passes"),  # beyond the 3% noise floor, under 5%
    pytest.param({("mixtral-8x7b", 1, "triton"): 1.04, ("mixtral-8x7b", 16, "cutlass"): 1.07},
                 ["mixtral-8x7b bf16 M=16 cutlass"], id="7%-fails"),
])
def test_compare_fail_slower_exits_1_only_for_points_beyond_the_percentage(base_run, tmp_path, slowdown, failing):
    """`moebench compare BASE NEW --fail-slower 5` with the default 3% noise floor: a point 4% slower is SLOWER
    and passes; one 7% slower is named and the exit status is 1."""
    new = _copy_run(base_run, tmp_path / "new", slowdown)
    proc = moebench_in_process("compare", str(base_run), str(new), "--fail-slower", "5", "--format", "csv")
    assert proc.returncode == (1 if failing else 0), proc.stderr
    table = pd.read_csv(io.StringIO(proc.stdout))
    slower = table[table["verdict"] == "SLOWER"]
    assert sorted(zip(slower["model"], slower["M"], slower["path"])) == sorted(slowdown)  # both are SLOWER
    regressions = [line.removeprefix("regression: ").split(":")[0] for line in proc.stderr.splitlines()
                   if line.startswith("regression: ")]
    assert regressions == failing
