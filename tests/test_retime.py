"""``moebench retime``: a table's entries against the default and the times they were tuned with. The logic runs on
stand-in benches (tests/pair_fakes.py: made-up times, no kernel), the layouts and refusals on files the tests
write; one end-to-end run times real kernels on the interpreter."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import moebench_in_process
from pair_fakes import pools_with

from moebench.audit import retime as retime_module
from moebench.audit.pairs import Judged, against, time_pairs
from moebench.kernels.classic import default_config
from moebench.store.runfolder import load_run
from moebench.tables.export import SIDECAR
from moebench.tables.files import read_table
from moebench.tables.formats import moebench as tiles
from moebench.tables.formats import sglang
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig
from moebench.workers import pools as pools_module

NAME = "E=8,N=64,device_name=NVIDIA_H200.json"  # the tiny preset's shape, as vLLM names it
GOOD = TileConfig(16, 32, 64, 1, 4, 2)  # as fast as the default
SLOW = TileConfig(32, 64, 64, 1, 4, 2)  # 30% slower than the default: stale
FAST = TileConfig(64, 64, 64, 1, 4, 2)  # 20% faster than the default
TIMES = {SLOW: 130.0, FAST: 80.0}


def write_table(folder: Path, entries: dict[int, TileConfig], name: str = NAME, triton: str | None = "3.5.0") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(ConfigTable(entries).to_json(triton))
    return path


@pytest.fixture
def fake(monkeypatch):
    """Benches of made-up times in place of the worker pools."""
    monkeypatch.setattr(pools_module, "Pools", pools_with(TIMES))


def retime_cli(*args: str, cwd: Path):
    return moebench_in_process("retime", *args, "--no-progress", cwd=cwd)


def test_a_slowed_entry_exits_1_naming_its_M(tmp_path, fake):
    table = write_table(tmp_path / "configs", {1: GOOD, 16: SLOW, 64: FAST})
    done = retime_cli(str(table), "--model", "tiny", "--format", "json", "--out", "runs", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "stale:" in done.stderr and "at M=16:" in done.stderr
    rows = {r["M"]: r for r in json.loads(done.stdout)["rows"]}
    assert {M: r["verdict"] for M, r in rows.items()} == {1: "SAME", 16: "SLOWER", 64: "FASTER"}
    assert rows[16]["ratio"] == pytest.approx(1.3)
    assert rows[1]["default"] == default_config(1, 8, None).label
    assert table.read_text() == ConfigTable({1: GOOD, 16: SLOW, 64: FAST}).to_json("3.5.0")  # not written
    meta, df = load_run(tmp_path / json.loads(done.stdout)["run"])
    assert meta["status"] == "complete" and meta["retime"]["tables"] == [str(table)]
    assert set(df["path"]) == {"triton-classic"} and df["phase"].isna().all()
    assert set(df["config_source"]) == {"heuristic", f"table:{NAME}@M=1", f"table:{NAME}@M=16", f"table:{NAME}@M=64"}
    assert (df.groupby("M").size() == 2 * 3).all()  # the entry and the default, three passes each


def test_a_table_whose_entries_hold_exits_0(tmp_path, fake):
    table = write_table(tmp_path, {1: GOOD, 64: FAST})
    done = retime_cli(str(table), "--model", "tiny", "--out", "runs", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "SLOWER" not in done.stdout and "stale" not in done.stderr


def test_write_replaces_only_the_stale_entries(tmp_path, fake):
    table = write_table(tmp_path / "configs", {1: GOOD, 16: SLOW, 64: FAST})
    done = retime_cli(str(table), "--model", "tiny", "--write", "--out", "runs", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # the finding stands, written or not
    assert f"refreshed {table}" in done.stderr
    raw = json.loads(table.read_text())
    assert raw.pop("triton_version") == "3.5.0"  # the file's own entry kept
    assert ConfigTable.from_json(table) == ConfigTable({1: GOOD, 16: default_config(16, 8, None), 64: FAST})


def test_a_failing_entry_is_stale_and_written_over(tmp_path, monkeypatch):
    monkeypatch.setattr(pools_module, "Pools", pools_with(TIMES, broken=(SLOW,)))
    table = write_table(tmp_path, {16: SLOW, 64: FAST})
    done = retime_cli(str(table), "--model", "tiny", "--write", "--format", "json", "--out", "runs", cwd=tmp_path)
    assert done.returncode == 1
    rows = {r["M"]: r for r in json.loads(done.stdout)["rows"]}
    assert rows[16]["verdict"] == "FAILED" and rows[16]["error"].startswith("compile")
    assert ConfigTable.from_json(table)[16] == default_config(16, 8, None)


def test_the_shape_comes_from_the_exports_sidecar(tmp_path, fake):
    """An export's folder: the sidecar gives the hidden size and top-k, and --write records what it replaced."""
    out = tmp_path / "export"
    table = write_table(out / "configs" / "triton_3_8_0", {1: GOOD, 16: SLOW}, triton=None)
    key = table.relative_to(out).as_posix()
    sidecar = {"format": "moebench-export", "version": 1, "files": {key: {
        "layout": "sglang", "device_name": "NVIDIA H200", "dtype": "bf16", "models": ["tiny"],
        "shape": {"experts": 8, "intermediate": 64, "hidden": 128, "topk": 2},
        "times": {"1": {"time_us": 90.0, "p20_us": 89.0, "p80_us": 91.0}}}}}
    (out / SIDECAR).write_text(json.dumps(sidecar))
    tf = read_table(table)
    assert (tf.layout, tf.hidden, tf.topk, tf.model, tf.kernel) == ("sglang", 128, 2, "tiny", "triton-classic")
    assert tf.tuned[1]["time_us"] == 90.0
    done = retime_cli(str(out), "--write", "--format", "json", "--out", "runs", cwd=tmp_path)
    assert done.returncode == 1 and "at M=16" in done.stderr
    assert "triton_version" not in json.loads(table.read_text())  # SGLang would read it as a token count
    entry = json.loads((out / SIDECAR).read_text())["files"][key]
    assert entry["refreshed"][0]["M"] == [16] and entry["times"]["16"]["time_us"] == pytest.approx(100.0)
    assert entry["times"]["1"]["time_us"] == 90.0


def test_the_tuned_with_time_is_judged_where_it_compares():
    j = Judged(1, GOOD, GOOD, 100.0, 100.0, 0.03, "SAME", a_spread=0.02)
    tuned_on = {"device_name": "NVIDIA H200", "dtype": "bf16", "hidden": 128, "topk": 2}
    tf = SimpleNamespace(tuned={1: {"time_us": 80.0, "p20_us": 79.0, "p80_us": 81.0}}, tuned_on=tuned_on)
    shape = SimpleNamespace(hidden=128, topk=2)
    planned = SimpleNamespace(file=tf, shape=shape, dtype="bf16")
    gpu = SimpleNamespace(interpreter=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(retime_module, "_here", lambda: "NVIDIA H200")
        line = retime_module._line(planned, j, gpu)
        assert (line.tuned_us, line.tuned_verdict) == (80.0, "SLOWER") and line.vs_tuned == pytest.approx(1.25)
        assert retime_module._line(planned, j, SimpleNamespace(interpreter=True)).tuned_us is None
        mp.setattr(retime_module, "_here", lambda: "NVIDIA H100 80GB HBM3")  # another GPU: not comparable
        assert retime_module._line(planned, j, gpu).tuned_us is None
    assert against(100.0, None, {"time_us": 80.0}) == (1.25, "UNKNOWN")  # no spread recorded: no verdict


def test_time_pairs_swaps_the_order_each_pass_and_times_one_config_once(tmp_path):
    Pools = pools_with(TIMES)
    pools = Pools()
    bench = pools.bench("triton-classic", {1: None, 16: None}, lambda t: None)
    judged = time_pairs(bench, {1: (SLOW, GOOD), 16: (GOOD, GOOD)}, "default", repeats=2)
    assert [k for M, k, _ in pools.log if M == 1] == [SLOW.key(), GOOD.key(), GOOD.key(), SLOW.key()]
    assert [k for M, k, _ in pools.log if M == 16] == [GOOD.key(), GOOD.key()]
    assert judged[1].verdict == "SLOWER" and judged[16].verdict == "SAME"


def test_layouts_are_told_apart_and_timed_in_their_kernel_form(tmp_path, fake):
    engine = write_table(tmp_path / "vllm", {4: GOOD})
    assert read_table(engine).layout == "vllm" and read_table(engine).kernel == "triton-classic"
    block = sglang.file_name(8, 64, "NVIDIA H200", "fp8-block128")
    assert read_table(write_table(tmp_path / "sg", {4: GOOD}, name=block)).layout == "sglang"  # "[128, 128]"
    meta = tiles.TableMeta("NVIDIA H200", "fp16", {"experts": 8, "intermediate": 64, "hidden": 128, "topk": 2})
    own = tmp_path / tiles.file_name(8, 64, "NVIDIA H200", "fp16")
    own.write_text(tiles.table_text(meta, ConfigTable({4: GOOD, 16: SLOW})))
    tf = read_table(own)
    assert (tf.layout, tf.kernel, tf.hidden) == ("moebench", "triton", 128)
    done = retime_cli(str(own), "--write", "--format", "json", "--out", "runs", cwd=tmp_path)
    assert done.returncode == 1
    assert {r["kernel"] for r in json.loads(done.stdout)["rows"]} == {"triton"}
    _, table = tiles.load_table(own)  # written back in its own layout, header kept
    assert table[4] == GOOD and table[16] != SLOW


def test_a_folder_leaves_out_other_shapes_and_devices(tmp_path, fake):
    folder = tmp_path / "configs"
    write_table(folder, {16: SLOW})
    write_table(folder, {16: SLOW}, name="E=16,N=64,device_name=NVIDIA_H200.json")  # another E
    (folder / "README.json").write_text("{}")  # no table's name: not read
    done = retime_cli(str(folder), "--model", "tiny", "--format", "json", "--out", "runs", cwd=tmp_path)
    assert done.returncode == 1
    assert {Path(r["file"]).name for r in json.loads(done.stdout)["rows"]} == {NAME}
    assert "1 table(s) left out" in done.stderr and "shape mismatch" in done.stderr


def test_an_sglang_folder_times_its_down_table_on_gemm2_and_leaves_int8_out(tmp_path, fake):
    """SGLang's ``_down`` table (its entries SGLang's GEMM2 configs) is timed on triton-classic-down, a note saying
    so; an int8_w8a16 table beside it is left out with a note naming it; --write replaces the stale entry alone,
    the file's indent (2), missing closing newline and carried USE_TMA kept."""
    folder = tmp_path / "configs" / "triton_3_8_0"
    up = write_table(folder, {16: GOOD}, triton=None)
    down = folder / NAME.replace(".json", "_down.json")
    tma = {"1": {**GOOD.to_vllm_dict(), "USE_TMA": True}, "16": {**SLOW.to_vllm_dict(), "USE_TMA": True}}
    down.write_text(json.dumps(tma, indent=2))
    int8 = write_table(folder, {16: SLOW}, name=NAME.replace(".json", ",dtype=int8_w8a16.json"), triton=None)
    done = retime_cli(str(tmp_path / "configs"), "--model", "tiny", "--write", "--format", "json", "--out", "runs",
                      cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert {(Path(r["file"]).name, r["kernel"], r["M"], r["verdict"]) for r in rows} == {
        (up.name, "triton-classic", 16, "SAME"), (down.name, "triton-classic-down", 1, "SAME"),
        (down.name, "triton-classic-down", 16, "SLOWER")}
    assert f"{down.name}: {retime_module.DOWN_NOTE}" in done.stderr
    assert f"{int8.name}: left out: not a dtype moebench times" in done.stderr
    assert down.read_text() == json.dumps({**tma, "16": default_config(16, 8, None).to_vllm_dict()}, indent=2)
    assert up.read_text() == ConfigTable({16: GOOD}).to_json()  # nothing stale: not written


def _table_at(tmp_path: Path) -> str:
    return str(write_table(tmp_path / "configs", {16: SLOW}))


@pytest.mark.parametrize("args, fragment", [
    (lambda p: [str(p / "nowhere.json"), "--model", "tiny"], "no such table file"),
    (lambda p: [str(write_table(p, {1: GOOD}, name="mine.json")), "--model", "tiny"], "unknown layout"),
    (lambda p: [_table_at(p), "--model", "mixtral-8x7b"], "shape mismatch"),
    (lambda p: [_table_at(p), "--model", "no-such-model"], "no-such-model"),
    (lambda p: [_table_at(p)], "hidden size is not in the file name"),
    (lambda p: [_table_at(p), "--model", "tiny", "--dtype", "fp8-block128"], "not fp8-block128"),
    (lambda p: [str((p / "empty").mkdir() or p / "empty"), "--model", "tiny"], "no table files"),
    (lambda p: [_table_at(p), "--hidden", "128"], "--hidden needs --topk"),
])
def test_bad_inputs_are_one_line_exit_2_and_write_nothing(tmp_path, fake, args, fragment):
    argv = args(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    done = retime_cli(*argv, "--write", "--out", "runs", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], lines
    assert not (tmp_path / "runs").exists()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_retime_runs_the_kernels_on_the_interpreter(tmp_path):
    """End to end, real kernels: the tiny preset's E and N in fp16 at one M (a narrower hidden size, one pass,
    to keep the interpreter's time short), the entry against the default."""
    table = write_table(tmp_path, {4: GOOD})
    done = retime_cli(str(table), "--hidden", "64", "--topk", "2", "--dtype", "fp16", "--repeats", "1",
                      "--format", "json", "--out", "runs", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr  # wall-clock times on the CPU: either verdict
    (r,) = json.loads(done.stdout)["rows"]
    assert r["now_us"] > 0 and r["default_us"] > 0 and r["error"] is None
    assert r["verdict"] in ("FASTER", "SLOWER", "SAME")
    _, df = load_run(tmp_path / json.loads(done.stdout)["run"])
    assert (df["status"] == "ok").all() and df["interpreter"].all() and len(df) == 2
