"""``export-configs --merge-with FILE``: per M both tables hold, the faster entry (timed back to back; ties keep
the shipped one), every other key of both kept, the sidecar saying where each entry came from. Timings come from
stand-in benches (tests/pair_fakes.py); the run folder is test_export's synthetic H200 tune."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import moebench_in_process
from pair_fakes import BASE_US, pools_with
from test_export import CLASSIC, META, tune_rows, write_run

from moebench import _interpret
from moebench.audit.merge import merge, prepare
from moebench.store.runfolder import load_run
from moebench.tables.export import SIDECAR, plan_export, write_export
from moebench.tables.formats import moebench as tiles
from moebench.tables.formats import vllm
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig
from moebench.workers import pools as pools_module

MS = [1, 16, 64, 256]
NAME = vllm.file_name(8, 14336, "NVIDIA H200", "bf16")  # the synthetic tune's table (mixtral-8x7b bf16)
SHIP_FAST = TileConfig(16, 128, 64, 1, 4, 4)  # 20% faster than any tuned entry
SHIP_SLOW = TileConfig(32, 128, 64, 1, 4, 4)  # 30% slower
SHIP_SAME = TileConfig(64, 128, 64, 1, 4, 4)  # as fast: a tie within the noise
SHIPPED = {1: SHIP_FAST, 16: SHIP_SLOW, 64: SHIP_SAME, 8192: SHIP_SLOW}  # 8192: a key the tune has not
TIMES = {SHIP_FAST: 0.8 * BASE_US, SHIP_SLOW: 1.3 * BASE_US}


@pytest.fixture
def run(tmp_path) -> Path:
    return write_run(tmp_path / "run", tune_rows("triton-classic", CLASSIC, ms=MS))


def shipped_file(folder: Path, entries=SHIPPED, name: str = NAME) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(ConfigTable(entries).to_json("3.4.0"))
    return path


def test_merge_keeps_the_faster_entry_per_M_and_every_other_key(run, tmp_path):
    meta, df = load_run(run)
    plan = plan_export(meta, df, tmp_path / "out")
    tuned = dict(plan.tables[tmp_path / "out" / NAME][1])
    m = prepare(plan, shipped_file(tmp_path / "engine", SHIPPED))
    merged = merge(m, plan, tmp_path / "runs", pools_with(TIMES)())
    table = merged.table
    assert table[1] == SHIP_FAST  # the shipped entry is faster
    assert table[16] == tuned[16]  # the tuned entry is faster
    assert table[64] == SHIP_SAME  # a tie keeps what the engine ships
    assert table[256] == tuned[256]  # only in the tune: kept
    assert table[8192] == SHIP_SLOW  # only in the shipped table: kept as it is
    keys = merged.sidecar["merged_with"]["keys"]
    assert {k: v["from"] for k, v in keys.items()} == {"1": "shipped", "16": "tuned", "64": "shipped",
                                                      "256": "tuned", "8192": "shipped"}
    assert keys["1"]["verdict"] == "SLOWER" and keys["1"]["shipped_us"] == pytest.approx(80.0)
    assert keys["16"]["verdict"] == "FASTER" and keys["64"]["verdict"] == "SAME"
    _, rows = load_run(merged.run_dir)
    assert set(rows["M"]) == {1, 16, 64} and set(rows["path"]) == {"triton-classic"}
    assert {s.split(":")[0] for s in rows["config_source"]} == {"tuned", "shipped"}
    done = write_export(plan, {m.file: merged.sidecar})
    assert ConfigTable.from_json(done.files[0]) == table
    entry = json.loads((tmp_path / "out" / SIDECAR).read_text())["files"][NAME]
    assert entry["merged_with"]["keys"]["16"]["from"] == "tuned" and entry["M"] == [1, 16, 64, 256, 8192]
    assert entry["times"]["1"]["time_us"] == pytest.approx(80.0)  # the merge's timing of the entry kept


def test_the_cli_merges_on_a_gpu(run, tmp_path, monkeypatch):
    monkeypatch.setattr(_interpret, "interpreting", lambda: False)
    monkeypatch.setattr(pools_module, "Pools", pools_with(TIMES))
    shipped = shipped_file(tmp_path / "engine")
    done = moebench_in_process("export-configs", str(run), "--out", "out", "--merge-with", str(shipped),
                               "--runs", "runs", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "M=16,256 from the tune, M=1,64,8192 shipped" in done.stderr
    assert ConfigTable.from_json(tmp_path / "out" / NAME)[8192] == SHIP_SLOW
    assert len(list((tmp_path / "runs").iterdir())) == 1


def _own_table(p: Path) -> str:
    meta = tiles.TableMeta("NVIDIA H200", "bf16", {"experts": 8, "intermediate": 14336, "hidden": 4096, "topk": 2})
    path = p / tiles.file_name(8, 14336, "NVIDIA H200", "bf16")
    path.write_text(tiles.table_text(meta, ConfigTable(SHIPPED)))
    return str(path)


@pytest.mark.parametrize("shipped, fragment", [
    (lambda p: str(p / "nowhere.json"), "no such table file"),
    (lambda p: str(shipped_file(p, name="shipped.json")), "unknown layout"),
    (lambda p: str(shipped_file(p, name=vllm.file_name(16, 14336, "NVIDIA H200", "bf16"))), "another shape"),
    (lambda p: str(shipped_file(p, name=vllm.file_name(8, 14336, "NVIDIA H100", "bf16"))), "another shape"),
    (lambda p: _own_table(p), "a moebench table of the triton kernel"),
    (lambda p: str(shipped_file(p, name=NAME.replace(".json", "_down.json"))), "(the down projection) alone"),
    (lambda p: str(shipped_file(p, name=NAME.replace(".json", ",dtype=int8_w8a16.json"))), "not a dtype moebench"),
    (lambda p: str(shipped_file(p)), "no CUDA GPU here"),  # right file, but timing needs a GPU
])
def test_bad_merge_inputs_are_one_line_exit_2_and_write_nothing(run, tmp_path, monkeypatch, shipped, fragment):
    monkeypatch.setattr(pools_module, "Pools", pools_with(TIMES))
    file = shipped(tmp_path)
    done = moebench_in_process("export-configs", str(run), "--out", "out", "--merge-with", file, "--runs", "runs",
                               cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], lines
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_an_export_records_the_time_each_entry_was_picked_with(run, tmp_path):
    """What retime sets today's times against: per M, the fastest row of the entry written (the final re-timing)."""
    meta, df = load_run(run)
    write_export(plan_export(meta, df, tmp_path / "out"))
    times = json.loads((tmp_path / "out" / SIDECAR).read_text())["files"][NAME]["times"]
    assert set(times) == {str(M) for M in MS}
    assert all(t["time_us"] == 110.0 for t in times.values())  # tune_rows: the final winner's time


def test_a_run_picked_over_several_shapes_is_refused(tmp_path):
    rows = tune_rows("triton-classic", CLASSIC, ms=MS)
    other = [{**r, "hidden": 2048, "model": "other"} for r in rows]
    meta, df = load_run(write_run(tmp_path / "run", rows + other, **META))
    plan = plan_export(meta, df, tmp_path / "out")
    with pytest.raises(Exception, match="over 2 problems"):
        prepare(plan, shipped_file(tmp_path / "engine"))
