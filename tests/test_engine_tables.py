"""The engines' own H200 tables read as the engines read them: vLLM's BLOCK_SIZE_M 8 entries, SGLang's USE_TMA key,
the nearest-M tie in the file's order; retime and --merge-with take them. The fixtures (tests/data/engine-tables)
hold the engines' file names and entries of the kinds they ship; timings come from stand-in benches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pair_fakes import pools_with
from test_export import META, write_run

from moebench.audit import retime as retime_module
from moebench.audit.merge import merge, prepare
from moebench.errors import UserError
from moebench.models import get_model, shard
from moebench.store.rows import Row
from moebench.store.runfolder import load_run
from moebench.tables.engine_entry import EngineTile, read_entry
from moebench.tables.export import plan_export, write_export
from moebench.tables.files import read_table, table_files, text_of
from moebench.tables.formats import sglang, vllm
from moebench.tables.pick import _tile
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig

DATA = Path(__file__).parent / "data" / "engine-tables"
H200 = "NVIDIA H200"
DSV3_VLLM = DATA / "vllm" / vllm.file_name(256, 256, H200, "fp8-block128")
DSV3_SGLANG = DATA / "sglang" / "configs" / "triton_3_4_0" / sglang.file_name(257, 256, H200, "fp8-block128")


def engine_read(path: Path, drop_version: bool) -> dict[int, dict]:
    """The engines' own reading: every key an int (vLLM pops "triton_version" first)."""
    raw = json.loads(path.read_text())
    if drop_version:
        raw.pop("triton_version", None)
    return {int(k): v for k, v in raw.items()}


@pytest.mark.parametrize("path", table_files(DATA), ids=lambda p: p.name)
def test_every_fixture_reads_back_as_the_engine_reads_it_and_writes_back_unchanged(path):
    tf = read_table(path)
    raw = engine_read(path, tf.layout == "vllm")
    assert list(tf.table.order) == list(raw)  # the file's order, which the nearest-M rule breaks ties by
    for m, entry in raw.items():
        assert tf.table[m].to_vllm_dict() == {k: entry[k] for k in tf.table[m].to_vllm_dict()}
        assert tf.table.extras.get(m, {}) == {k: v for k, v in entry.items() if k not in tf.table[m].to_vllm_dict()}
    assert text_of(tf, tf.table) == path.read_text()  # retime --write keeps what it does not replace


def test_vllm_block_m_8_entries_are_read_and_equal_to_a_tile_of_the_same_fields():
    tf = read_table(DSV3_VLLM)
    assert (tf.layout, tf.experts, tf.n, tf.dtype) == ("vllm", 256, 256, "fp8-block128")
    assert [m for m, c in tf.table.items() if c.BLOCK_SIZE_M == 8] == [1, 2, 4]  # the precondition: M=1-4
    assert isinstance(tf.table[1], EngineTile) and type(tf.table[8]) is TileConfig  # in moebench's range: a TileConfig
    with pytest.raises(UserError):
        TileConfig(8, 64, 128)  # moebench's own kernel still refuses it


def test_sglang_use_tma_is_carried_with_its_entry():
    tf = read_table(DSV3_SGLANG)
    assert (tf.layout, tf.experts) == ("sglang", 257)
    assert tf.table.extras[64] == {"USE_TMA": True} and tf.table.extras[1] == {"USE_TMA": False}


@pytest.mark.parametrize("entry, says", [
    ({"BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128}, "GROUP_SIZE_M"),  # a constexpr with no default
    ({"BLOCK_SIZE_M": 12, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}, "power of two"),  # tl.arange
    ({"BLOCK_SIZE_M": True, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}, "integer"),
    ({"BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 3}, "num_warps"),
])
def test_entries_the_engines_launch_would_not_take_are_refused(entry, says):
    with pytest.raises(UserError, match=says):
        read_entry(entry, "vllm")


def test_nearest_m_ties_go_to_the_first_key_in_the_files_order(tmp_path):
    """vLLM's min() over the file's keys: with 32 listed before 16, M=24 reads 32, not the smaller 16."""
    path = tmp_path / vllm.file_name(8, 14336, "NVIDIA H100 80GB HBM3", "bf16")
    entry = TileConfig(16, 64, 64, 1, 4, 3).to_vllm_dict()
    path.write_text(json.dumps({"32": entry, "16": entry, "64": entry}))
    raw = engine_read(path, True)
    vllm_pick = min(raw, key=lambda x: abs(x - 24))
    table = ConfigTable.from_json(path)
    assert vllm_pick == 32 and table.nearest_key(24) == vllm_pick
    assert list(table) == [16, 32, 64]  # iterated ascending all the same


# ---- retime and --merge-with take them ----

def test_retime_takes_vllms_deepseek_table_with_block_m_8(tmp_path):
    """The drift check of a Triton upgrade runs on vLLM's DeepSeek-V3@tp8 table: each entry timed against the
    default, BLOCK_SIZE_M 8 included; --write keeps the other entries and the triton_version entry."""
    table = tmp_path / DSV3_VLLM.name
    shutil.copy(DSV3_VLLM, table)
    shape = shard(get_model("deepseek-v3"), tp=8)
    planned = retime_module.plan([table], shape)
    eight = read_table(table).table[1]
    pools = pools_with({eight: 130.0})()  # the BLOCK_SIZE_M 8 entry of M=1 and 2, 30% slower than the default
    result = retime_module.retime(planned, tmp_path / "runs", pools, write=True)
    (t,) = result.tables
    assert t.stale == [1, 2] and set(t.lines) == set(read_table(DSV3_VLLM).table)
    _, rows = load_run(result.run_dir)
    assert 8 in {r["BLOCK_SIZE_M"] for r in rows["config"]}  # it was timed, and its rows read back
    assert {_tile(c, "triton-classic").BLOCK_SIZE_M for c in rows["config"]} >= {8}  # the rows read back
    written = json.loads(table.read_text())
    original = json.loads(DSV3_VLLM.read_text())
    assert written["4"] == original["4"] and written["triton_version"] == original["triton_version"]
    assert written["1"] != original["1"] and list(written) == list(original)


def test_retime_names_the_keys_an_sglang_table_carries(tmp_path):
    notes: list[str] = []
    from moebench.models import explicit_shape

    retime_module.plan([DSV3_SGLANG], explicit_shape(257, 7168, 256, 9), notes=notes)
    assert any("USE_TMA at M=1,8,64,512,4096" in n and "SGLang's kernel reads the tiles by TMA" in n for n in notes)


def deepseek_run(folder: Path) -> Path:
    """A tune of DeepSeek-V3@tp8 fp8-block128 on the engines' form at M=1, 8 and 8192."""
    s = shard(get_model("deepseek-v3"), tp=8)
    rows = [Row(model=s.name, experts=s.experts, hidden=s.hidden, intermediate=s.intermediate, topk=s.topk,
                moe_layers=s.moe_layers, M=M, dtype="fp8-block128", path="triton-classic", routing="uniform", seed=0,
                config=TileConfig(16, 128, 128, 1, 4, 3).as_dict(), correct=True, time_us=100.0,
                device_name=H200, phase="final").as_dict() for M in (1, 8, 8192)]
    return write_run(folder, rows, **META)


def test_merge_with_takes_vllms_deepseek_table(tmp_path):
    meta, df = load_run(deepseek_run(tmp_path / "run"))
    plan = plan_export(meta, df, tmp_path / "out")
    m = prepare(plan, DSV3_VLLM)
    shipped = read_table(DSV3_VLLM).table
    merged = merge(m, plan, tmp_path / "runs", pools_with({shipped[1]: 80.0})())
    assert merged.table[1] == shipped[1] and merged.table[1].BLOCK_SIZE_M == 8  # the shipped entry is faster
    assert merged.table[8192] == TileConfig(16, 128, 128, 1, 4, 3) and merged.table[4] == shipped[4]
    done = write_export(plan, {m.file: merged.sidecar})
    assert json.loads(done.files[0].read_text())["1"]["BLOCK_SIZE_M"] == 8


TUNED = TileConfig(32, 128, 128, 1, 4, 3)


def test_merge_with_keeps_the_keys_a_kept_sglang_entry_carries(tmp_path):
    s = shard(get_model("deepseek-v3"), tp=8)
    rows = [Row(model="deepseek-v3@tp8+shared", experts=257, hidden=s.hidden, intermediate=256, topk=9,
                moe_layers=s.moe_layers, M=M, dtype="fp8-block128", path="triton-classic", routing="uniform", seed=0,
                config=TUNED.as_dict(), correct=True, time_us=100.0,
                device_name=H200, phase="final").as_dict() for M in (1, 512)]
    meta, df = load_run(write_run(tmp_path / "run", rows, **META))
    plan = plan_export(meta, df, tmp_path / "out", layout="sglang", engine_triton="3.4.0")
    m = prepare(plan, DSV3_SGLANG)
    shipped = read_table(DSV3_SGLANG).table
    merged = merge(m, plan, tmp_path / "runs", pools_with({TUNED: 90.0, shipped[512]: 80.0})())
    assert merged.table[1] == TUNED and merged.table[512] == shipped[512]  # the precondition: one entry from each
    assert merged.table.extras == {8: {"USE_TMA": False}, 64: {"USE_TMA": True}, 512: {"USE_TMA": True},
                                   4096: {"USE_TMA": True}}  # M=1's tuned entry carries nothing
    done = write_export(plan, {m.file: merged.sidecar})
    assert json.loads(done.files[0].read_text())["64"]["USE_TMA"] is True
