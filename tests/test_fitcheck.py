"""``moebench fit-check`` and ``fit-time`` on the CPU: the fitted default checked leave-one-shape-out on the shipped
tables with the recorded runs' timings, the points file a GPU run reads, and the timing of those points on
stand-in benches (tests/pair_fakes.py: made-up times, no kernel)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import moebench_in_process
from pair_fakes import pools_with

from moebench.audit.fitcheck import (
    POINTS_FORMAT,
    heuristic,
    leave_one_out,
    points,
    ratio,
    recorded_times,
    write_points,
)
from moebench.audit.fittime import GOAL_VS_TABLE, read_points, time_points
from moebench.dtypes import DTYPES
from moebench.errors import UserError
from moebench.kernels.classic import default_config as classic_default
from moebench.space.declared import VLLM_MS
from moebench.store.runfolder import load_run
from moebench.tables import lookup
from moebench.tables.fitted import BORROW, CLASS_OF, Tuned, Where
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig
from moebench.tune.served import SERVED, Served

ROOT = Path(__file__).resolve().parent.parent  # the tables' source runs are named from here
SHIPPED = [Tuned.of_file(p) for p in sorted(lookup.SHIPPED_DIR.glob("moebench-tiles_*.json"))]
H200 = "NVIDIA H200"


def test_leave_one_out_covers_every_key_and_never_predicts_from_the_held_out_shape():
    checks = leave_one_out(SHIPPED, root=ROOT)
    assert sorted((c.table.name, c.M) for c in checks) == sorted((t.name, m) for t in SHIPPED for m in t.table)
    for c in checks:
        assert c.tuned == c.table.table[c.M]
        assert c.fitted is None or c.fitted.table.shape != c.table.shape
        if c.fitted is None:
            assert c.predicted == heuristic(c.table.at(c.M), c.table.dtype)
        # a table whose class has no other shape's tables to fit from (nor borrow from) is predicted by the heuristic
        klass = CLASS_OF[c.table.dtype]
        if not [t for t in SHIPPED if t.shape != c.table.shape and CLASS_OF[t.dtype] in (klass, *BORROW[klass])]:
            assert c.fitted is None
    timed = [c for c in checks if c.ratio is not None]
    assert timed and all(c.ratio > 0 and c.budget in ("final", "screen") for c in timed)  # the source runs were read


def _run(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text("{}")
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


A, B = TileConfig(16, 64, 128), TileConfig(32, 64, 128)
T = Tuned("t.json", 8, 64, 128, 2, "fp16", H200, ConfigTable({4: A}))


def _row(cfg: TileConfig, M: int, phase: str, us: float, **other) -> dict:
    return {"experts": 8, "intermediate": 64, "hidden": 128, "topk": 2, "dtype": "fp16", "path": "triton",
            "device_name": H200, "M": M, "phase": phase, "status": "ok", "time_us": us, "config": cfg.as_dict(),
            **other}


def test_recorded_times_are_medians_per_budget_of_the_tables_own_shape(tmp_path):
    run = _run(tmp_path / "run", [
        _row(A, 4, "screen", 10.0), _row(A, 4, "screen", 14.0), _row(A, 4, "screen", 90.0),
        _row(B, 4, "screen", 12.0), _row(A, 4, "final", 20.0), _row(B, 4, "default", 10.0),
        _row(B, 4, "final", 1.0, dtype="bf16"), _row(B, 4, "final", 1.0, path="triton-classic"),
        _row(B, 4, "final", 1.0, device_name="NVIDIA H100"), _row(B, 4, "final", 1.0, status="error"),
        _row(B, 4, "final", 1.0, hidden=256),
    ])
    times = recorded_times([run, tmp_path / "not-a-run"], T)
    assert times[("screen", 4, A.key())] == 14.0 and times[("final", 4, B.key())] == 10.0
    assert ratio(times, 4, A, B) == (2.0, "final")  # the final budget first, though the screens have both
    assert ratio(times, 16, A, B) == (None, None)
    only_screens = {k: v for k, v in times.items() if k[0] == "screen"}
    assert ratio(only_screens, 4, A, B) == (pytest.approx(14.0 / 12.0), "screen")


def test_the_points_cover_each_served_entry_at_vllms_m_with_both_defaults():
    pts = points(SHIPPED, H200)
    assert len(pts) == len(SERVED) * len(VLLM_MS)
    for p in pts:
        shape = (p["experts"], p["intermediate"], p["hidden"], p["topk"])
        assert p["classic"] == classic_default(p["M"], p["experts"], DTYPES[p["dtype"]].fp8_scheme).as_dict()
        where = Where(p["M"], p["experts"], p["topk"], p["hidden"], p["intermediate"])
        assert p["heuristic"] == heuristic(where, p["dtype"]).as_dict()
        own = [t for t in SHIPPED if t.shape == shape and t.dtype == p["dtype"]]
        assert (p["table"] is None) == (not own)
        if own:
            assert p["table"] == own[0].table.nearest(p["M"]).as_dict()
        assert not any(p["fitted_from"].startswith(f"fitted from {t.name}") for t in SHIPPED if t.shape == shape)
        if p["fitted_from"] == "heuristic":
            assert p["fitted"] == p["heuristic"]


def test_a_points_file_reads_back_and_a_foreign_one_is_one_line(tmp_path):
    pts = points(SHIPPED, H200, entries=SERVED[:1], ms=(1, 64))
    write_points(tmp_path / "p.json", pts, H200, SHIPPED)
    assert read_points(tmp_path / "p.json") == pts
    (tmp_path / "other.json").write_text(json.dumps({"format": "something", "points": []}))
    with pytest.raises(UserError, match=f"not a {POINTS_FORMAT} file"):
        read_points(tmp_path / "other.json")
    newer = json.loads((tmp_path / "p.json").read_text()) | {"version": 99}
    (tmp_path / "newer.json").write_text(json.dumps(newer))
    notes: list[str] = []
    assert read_points(tmp_path / "newer.json", notes) == pts and "version 99" in notes[0]


TINY_ENTRY = Served("tiny", 1, "fp16", "a shape the CPU runs")


def _tiny_points(tuned: TileConfig | None) -> list[dict]:
    tables = [Tuned("tiny.json", 8, 64, 128, 2, "fp16", H200, ConfigTable({1: tuned}))] if tuned else []
    return points(tables, H200, entries=[TINY_ENTRY], ms=(1,))


@pytest.mark.parametrize("table_us, meets", [(95.0, True), (80.0, False)])
def test_fit_time_judges_the_fitted_config_against_the_engines_default_and_the_table(tmp_path, table_us, meets):
    """Fitted 100 us (a made-up time), the engines' default 130: FASTER. The table 95: within 10%, the goal is
    met; the table 80: 1.25x, missed."""
    tuned = TileConfig(32, 32, 32, 1, 4, 2)
    (p,) = _tiny_points(tuned)
    fitted, classic = TileConfig.from_dict(p["fitted"]), TileConfig.from_dict(p["classic"])
    assert len({fitted.key(), classic.key(), tuned.key()}) == 3  # three configs, three made-up times
    pools = pools_with({classic: 130.0, tuned: table_us})()  # anything else: 100
    (t,) = time_points([p], tmp_path / "runs", pools, repeats=2).timings
    assert sorted(set(pools.paths)) == ["triton", "triton-classic"]
    assert t.us == {"fitted": 100.0, "other": table_us, "classic": 130.0} and t.other == "table"
    assert (t.vs_classic, t.classic_verdict) == (pytest.approx(100 / 130), "FASTER")
    assert t.vs_other == pytest.approx(100 / table_us) and t.meets is meets
    assert (t.vs_other <= GOAL_VS_TABLE) is meets
    (run,) = (tmp_path / "runs").iterdir()
    meta, df = load_run(run)
    assert meta["status"] == "complete" and meta["fit_time"] == {"points": 1, "repeats": 2}
    assert set(df["config_source"]) == {p["fitted_from"], f"table:{p['table_from']}", "classic default"}
    assert set(df.loc[df["config_source"] == "classic default", "path"]) == {"triton-classic"}
    assert len(df) == 3 * 2  # three configs, two passes


def test_fit_time_without_a_table_compares_with_the_heuristic_and_a_slower_fit_misses(tmp_path):
    (p,) = _tiny_points(None)
    assert p["table"] is None and p["fitted_from"] == "heuristic"  # no table: the fit gives the heuristic too
    classic = TileConfig.from_dict(p["classic"])
    (t,) = time_points([p], tmp_path / "runs", pools_with({classic: 70.0})(), repeats=1).timings
    assert (t.other, t.other_verdict, t.classic_verdict, t.meets) == ("heuristic", "SAME", "SLOWER", False)


def test_fit_check_prints_each_held_out_point_and_writes_the_points(tmp_path):
    done = moebench_in_process("fit-check", "--format", "json", "--points", str(tmp_path / "p.json"), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert len(rows) == sum(len(t.table) for t in SHIPPED)
    assert len(read_points(tmp_path / "p.json")) == len(SERVED) * len(VLLM_MS)
    assert "held-out points" in done.stderr


def test_fit_time_needs_a_gpu(tmp_path):
    write_points(tmp_path / "p.json", _tiny_points(None), H200, [])
    done = moebench_in_process("fit-time", str(tmp_path / "p.json"), "--out", str(tmp_path / "runs"))
    assert done.returncode == 2 and "no CUDA GPU" in done.stderr and not (tmp_path / "runs").exists()


def test_a_shipped_tables_source_run_is_found_from_any_folder(tmp_path, monkeypatch):
    """A shipped table's source_run is relative to the checkout: fit-check finds it from another folder too
    (run outside the checkout it found none, and showed no recorded ratio)."""
    from moebench.audit.fitcheck import source_runs

    monkeypatch.chdir(tmp_path)
    found = [t for t in SHIPPED if source_runs(t)]
    assert found and all(source_runs(t)[0] == source_runs(t, root=ROOT)[0] for t in found)
    assert source_runs(SHIPPED[0], root=tmp_path) == []  # a root given is the only one looked in


def test_the_goal_per_shape_is_the_issues_never_slower_than_classic_and_a_geometric_mean_within_10pc():
    """Per entry: a point SLOWER than the engines' default (or failed) misses whatever the mean; a tabled shape
    misses where fitted / table over its points is over 1.10x by the geometric mean, not where one point is."""
    from moebench.audit.fittime import Timing, shape_goals
    from moebench.cli.fitcheck import _goal_text, goal_row

    def timing(model, M, vs_classic, verdict, vs_table):
        p = {"model": model, "tp": 1, "dtype": "bf16", "M": M, "table": {} if vs_table else None}
        return Timing(p, {}, vs_classic, verdict, vs_table, "SAME", "table" if vs_table else "heuristic")

    ts = [timing("a", 1, 0.8, "FASTER", 1.25), timing("a", 2, 0.9, "FASTER", 0.98),  # one point at 1.25x: 1.107
          timing("b", 1, 0.8, "FASTER", 1.15), timing("b", 2, 0.9, "SAME", 1.0),  # 1.072: met
          timing("c", 1, 1.2, "SLOWER", None), timing("c", 2, None, "FAILED", None)]  # no table
    a, b, c = shape_goals(ts)
    assert (a.points, a.vs_table, a.meets) == (2, pytest.approx((1.25 * 0.98) ** 0.5), False)
    assert b.meets and not b.behind_classic and b.vs_table == pytest.approx(1.15**0.5)
    assert (c.behind_classic, c.vs_table, c.meets) == ((1, 2), None, False)
    assert _goal_text(goal_row(a)) == "a bf16: 1.107x the table by the geometric mean"
    assert _goal_text(goal_row(c)) == "c bf16: SLOWER than the engines' default at M=1,2"
