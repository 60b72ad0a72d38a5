"""Tile-config tables: vLLM/SGLang file names, nearest-M lookup, JSON round trip, best configs, the export's
files, and the registry of formats."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from moebench.errors import UserError
from moebench.paths.registry import PATHS
from moebench.tables.export import SIDECAR, export_run
from moebench.tables.formats import FORMATS, get_format, sglang, vllm
from moebench.tables.pick import best_configs
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig

VLLM_KEYS = ["BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"]


# ---- the engines' own rules, transcribed from their sources as the reference -------------------

def vllm_file_name(E: int, N: int, device: str, dtype: str | None, block_shape: list[int] | None) -> str:
    """vLLM fused_moe.py get_config_file_name, with get_device_name() replaced by ``device``."""
    device_name = device.replace(" ", "_")
    if "H200" in device_name.split("_"):
        device_name = "NVIDIA_H200"
    dtype_selector = "" if not dtype else f",dtype={dtype}"
    block_shape_selector = (
        "" if not block_shape or not all(block_shape) else f",block_shape={block_shape}"
    ).replace(" ", "")
    return f"E={E},N={N},device_name={device_name}{dtype_selector}{block_shape_selector}.json"


def sglang_file_name(E, N, device, dtype, block_shape, per_channel_quant=False) -> str:
    """SGLang fused_moe_triton_config.py get_config_file_name (no space removal, no H200 folding)."""
    device_name = device.replace(" ", "_")
    dtype_selector = "" if not dtype else f",dtype={dtype}"
    block_shape_selector = "" if not block_shape or not all(block_shape) else f",block_shape={block_shape}"
    per_channel_quant_selector = ",per_channel_quant=True" if per_channel_quant else ""
    return (f"E={E},N={N},device_name={device_name}{dtype_selector}{block_shape_selector}"
            f"{per_channel_quant_selector}.json")


def engine_lookup(text: str, M: int) -> dict:
    """How vLLM and SGLang read a config file and pick the entry for M tokens."""
    tuned = json.loads(text)
    tuned.pop("triton_version", None)
    configs = {int(key): val for key, val in tuned.items()}
    return configs[min(configs.keys(), key=lambda x: abs(x - M))]


# ---- file names --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "dtype, engine_dtype, block_shape",
    [
        ("bf16", None, None),
        ("fp16", None, None),
        ("fp32", "float32", None),  # vLLM and SGLang: float32 activations get their own file
        ("fp8-tensor", "fp8_w8a8", None),
        ("fp8-channel", "fp8_w8a8", None),
        ("fp8-block128", "fp8_w8a8", [128, 128]),
    ],
)
def test_vllm_file_names_follow_vllm(dtype, engine_dtype, block_shape):
    for device in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        expected = vllm_file_name(8, 14336, device, engine_dtype, block_shape)
        assert vllm.file_name(8, 14336, device, dtype) == expected


def test_file_names_match_files_shipped_by_the_engines():
    # vllm/model_executor/layers/fused_moe/configs/ ships this name (no space in the block shape) ...
    assert (vllm.file_name(128, 384, "NVIDIA H200", "fp8-block128")
            == "E=128,N=384,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json")
    # ... and SGLang's configs/triton_3_4_0/ this one (with the space).
    assert (sglang.file_name(32, 768, "NVIDIA H200", "fp8-block128")
            == "E=32,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json")
    assert vllm.file_name(8, 14336, "NVIDIA H200", "bf16") == "E=8,N=14336,device_name=NVIDIA_H200.json"
    assert (vllm.file_name(8, 14336, "NVIDIA H200", "fp8-tensor")
            == "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8.json")


@pytest.mark.parametrize(
    "dtype, engine_dtype, block_shape, per_channel",
    [
        ("bf16", None, None, False),
        ("fp8-tensor", "fp8_w8a8", None, False),
        ("fp8-channel", "fp8_w8a8", None, True),
        ("fp8-block128", "fp8_w8a8", [128, 128], False),
    ],
)
def test_sglang_file_names_follow_sglang(dtype, engine_dtype, block_shape, per_channel):
    for device in ("NVIDIA H200", "NVIDIA H200 NVL"):
        expected = sglang_file_name(64, 1408, device, engine_dtype, block_shape, per_channel)
        assert sglang.file_name(64, 1408, device, dtype) == expected


def test_vllm_folds_h200_variants_into_one_name():
    nvl = vllm.file_name(8, 7168, "NVIDIA H200 NVL", "bf16")
    assert nvl == vllm.file_name(8, 7168, "NVIDIA H200", "bf16")
    assert "NVIDIA_H200_NVL" in sglang.file_name(8, 7168, "NVIDIA H200 NVL", "bf16")


@pytest.mark.parametrize("layout", list(FORMATS))
def test_file_name_rejects_unknown_dtype(layout):
    with pytest.raises(UserError, match="dtype"):
        FORMATS[layout].file_name(8, 14336, "NVIDIA H200", "int4")


def test_an_unknown_layout_is_a_user_error_naming_the_known_ones():
    with pytest.raises(UserError, match="layout 'trtllm'; choose one of: vllm, sglang, moebench"):
        get_format("trtllm")


# ---- the table ---------------------------------------------------------------------------------

def tile(block_m: int, stages: int = 3) -> TileConfig:
    return TileConfig(block_m, 64, 128, 1, 4, stages)


def sample_table() -> ConfigTable:
    # given out of order on purpose: the table and its file keep M ascending
    return ConfigTable({256: tile(64), 1: tile(16, 5), 16: tile(16, 4), 32: tile(32), 4096: tile(128)})


def test_nearest_follows_the_engines_rule_on_the_written_file():
    table = sample_table()
    text = table.to_json()
    for M in range(1, 6000):
        assert table.nearest(M).to_vllm_dict() == engine_lookup(text, M)


def test_nearest_tie_goes_to_the_key_first_in_the_file():
    table = ConfigTable({32: tile(32), 16: tile(16)})
    # M=24 is 8 from both keys; min() keeps the first of the file, which lists 16 first
    first_in_file = next(iter(json.loads(table.to_json())))
    assert first_in_file == "16"
    assert table.nearest(24) == table[16]
    assert table.nearest(25) == table[32]


def test_nearest_on_an_empty_table_is_a_user_error():
    with pytest.raises(UserError, match="empty"):
        ConfigTable().nearest(1)


def test_json_layout_and_round_trip(tmp_path):
    table = sample_table()
    text = table.to_json()
    raw = json.loads(text)
    assert list(raw) == [str(m) for m in sorted(table)]  # numeric order: "16" before "256"
    for m, cfg in raw.items():
        assert list(cfg) == VLLM_KEYS
        assert cfg == table[int(m)].to_vllm_dict()
    assert text.endswith("}\n")
    assert ConfigTable.from_json(text) == table
    path = tmp_path / "E=8,N=14336,device_name=NVIDIA_H200.json"
    path.write_text(text)
    assert ConfigTable.from_json(path) == table
    assert ConfigTable.from_json(str(path)) == table


def test_from_json_ignores_triton_version_like_vllm():
    raw = json.loads(sample_table().to_json())
    raw["triton_version"] = "3.4.0"
    assert ConfigTable.from_json(json.dumps(raw)) == sample_table()


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"1": {"BLOCK_SIZE_M": 16,', "not JSON"),
        ('[1, 2]', "JSON object"),
        ('{"one": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}}', "'one'"),
        ('{"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "GROUP_SIZE_M": 1}}', "BLOCK_SIZE_K"),
        ('{"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}}', "GROUP_SIZE_M"),  # no default
        ('{"1": {"BLOCK_SIZE_M": 12, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}}', "power of two"),
        ('{"1": {"BLOCK_SIZE_M": 16.0, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}}', "integer"),
        ('{"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "x": [1]}}',
         "no single value"),
        ('{"1": 16}', "M=1"),
        ("{}", "no tile configs"),
    ],
)
def test_from_json_errors_name_the_file(tmp_path, content, message):
    path = tmp_path / "E=8,N=14336,device_name=NVIDIA_H200.json"
    path.write_text(content)
    with pytest.raises(UserError, match=message) as err:
        ConfigTable.from_json(path)
    assert str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_from_json_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="missing.json"):
        ConfigTable.from_json(tmp_path / "missing.json")


def test_to_json_with_triton_version_writes_it_last_and_vllm_reads_past_it():
    """vLLM's tuner writes "triton_version" after the M keys and vLLM pops it: the table reads back unchanged."""
    table = sample_table()
    text = table.to_json(triton_version="3.6.0")
    raw = json.loads(text)
    assert list(raw)[-1] == "triton_version" and raw["triton_version"] == "3.6.0"
    assert ConfigTable.from_json(text) == table
    for M in (1, 3, 200, 5000):
        assert engine_lookup(text, M) == table.nearest(M).to_vllm_dict()
    assert "triton_version" not in table.to_json()


# ---- best configs from a run -------------------------------------------------------------------

SHAPE = {
    "model": "mixtral-8x7b", "experts": 8, "hidden": 4096, "intermediate": 14336, "topk": 2, "moe_layers": 32,
}
TABLE = (8, 14336, "bf16", "NVIDIA H200")
# vLLM's benchmark_moe.py default batch sizes: what a default tune covers
VLLM_BATCH_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]


def row(M: int, cfg: TileConfig | None, time_us: float, **over) -> dict:
    r = {
        **SHAPE, "M": M, "dtype": "bf16", "path": "triton-classic", "routing": "uniform",
        "config": cfg.as_dict() if cfg else None, "status": "ok", "correct": True, "rel_err": 1e-3,
        "time_us": time_us, "time_p20_us": time_us, "time_p80_us": time_us, "floor_us": None,
        "pct_of_floor": None, "tflops": 1.0, "gbps": 1.0, "device_name": "NVIDIA H200", "interpreter": False,
        "phase": None,
    }
    r.update(over)
    return r


def test_best_configs_picks_the_fastest_ok_triton_classic_config_per_M():
    a, b, c = tile(16), tile(32), tile(64)
    rows = [
        row(1, a, 50.0), row(1, b, 40.0), row(1, c, 45.0),
        row(1, c, 10.0, status="incorrect", correct=False),  # fast but wrong: never chosen
        row(1, None, 5.0, path="torch"),  # another path
        row(256, a, 900.0), row(256, b, 700.0), row(256, c, 400.0),
        row(256, a, 300.0, dtype="fp8-tensor"), row(256, c, 350.0, dtype="fp8-tensor"),
    ]
    df = pd.DataFrame(rows)
    tables = best_configs(df)
    assert set(tables) == {TABLE, (8, 14336, "fp8-tensor", "NVIDIA H200")}
    ok = df[(df["status"] == "ok") & (df["path"] == "triton-classic")]
    for (_, _, dtype, _), table in tables.items():
        for M in table:
            at = ok[(ok["dtype"] == dtype) & (ok["M"] == M)]
            fastest = at.loc[at["time_us"].idxmin(), "config"]
            assert table[M] == TileConfig.from_dict(fastest)
    assert list(tables[TABLE]) == [1, 256]
    assert best_configs(df[df["path"] == "torch"]) == {}


def test_engine_tables_come_from_triton_classic_rows_only():
    """moebench's kernel (path triton) computes gate and up in one tile: a faster triton row, even one with
    the engines' six fields only, says nothing about the engines' kernel. path="triton" picks from those rows."""
    a, b = tile(16), tile(32)
    df = pd.DataFrame([row(1, a, 50.0), row(1, b, 10.0, path="triton")])
    assert best_configs(df)[TABLE][1] == a
    assert best_configs(df, path="triton")[TABLE][1] == b
    assert best_configs(df[df["path"] == "triton"]) == {}


def test_engine_tables_see_a_config_as_the_six_fields_the_classic_path_reads():
    """Rows of one engine config written two ways (the six keys only; every field, GEMM2's width spelled out
    as GEMM1's) are one config: timed on both routings, it beats b, timed on both too."""
    from dataclasses import replace as dc_replace

    a, b = tile(16), tile(32)
    six = dict(a.to_vllm_dict())
    spelled = dc_replace(a, gemm2_block_n=a.BLOCK_SIZE_N)
    assert spelled.portable and spelled != a  # the precondition: two spellings of one engine config
    rows = [row(1, None, 10.0, config=six), row(1, b, 11.0),
            row(1, spelled, 10.0, routing="skewed"), row(1, b, 11.0, routing="skewed")]
    assert best_configs(pd.DataFrame(rows))[TABLE][1] == a


def test_moebench_tables_keep_every_field():
    from dataclasses import replace as dc_replace

    ran = dc_replace(tile(16), swap_ab=True, gemm2_block_n=128, tail_tiles=0, gemm1_tma=True)
    assert best_configs(pd.DataFrame([row(1, ran, 5.0, path="triton")]), path="triton")[TABLE][1] == ran


def test_final_phase_times_pick_where_an_M_has_them():
    """A tune's screen timings rank candidates; the final re-timings of the kept few pick. At M=1 the screen
    says a, the final says b; at M=2 only screen rows exist (a sweep-like M): they pick."""
    a, b = tile(16), tile(32)
    rows = [
        row(1, a, 10.0, phase="screen"), row(1, b, 12.0, phase="screen"),
        row(1, a, 30.0, phase="final"), row(1, b, 20.0, phase="final"),
        row(2, a, 10.0, phase="screen"), row(2, b, 12.0, phase="screen"),
        row(4, b, 5.0),  # a sweep row (no phase)
    ]
    table = best_configs(pd.DataFrame(rows))[TABLE]
    assert (table[1], table[2], table[4]) == (b, a, b)
    # final rows that failed their check do not count as "this M has final times": the screen picks again
    rows[2] = row(1, a, 30.0, phase="final", status="incorrect", correct=False)
    rows[3] = row(1, b, None, phase="final", status="error", failure="compile")
    assert best_configs(pd.DataFrame(rows))[TABLE][1] == a


def test_default_phase_times_pick_over_final_ones():
    """A tune re-times its choice beside the path's default ("default" phase): where the default is faster
    there, the table holds the default, whatever the final phase said; M=2 has no default rows: final picks."""
    chosen, default = tile(16), tile(32)
    rows = [
        row(1, chosen, 10.0, phase="final"), row(1, default, 11.0, phase="screen"),
        row(1, chosen, 12.0, phase="default"), row(1, default, 11.5, phase="default"),
        row(2, chosen, 10.0, phase="final"), row(2, default, 9.0, phase="screen"),
    ]
    table = best_configs(pd.DataFrame(rows))[TABLE]
    assert (table[1], table[2]) == (default, chosen)


def test_best_configs_has_a_key_for_every_tuned_M():
    table = best_configs(pd.DataFrame([row(m, tile(16), 1.0 + m, phase="final") for m in VLLM_BATCH_SIZES]))[TABLE]
    assert list(table) == VLLM_BATCH_SIZES and len(table) == 18


def test_best_configs_refuses_interpreter_timings():
    df = pd.DataFrame([row(1, tile(16), 5000.0, interpreter=True, device_name="cpu")])
    with pytest.raises(UserError, match="interpreter"):
        best_configs(df)


def test_best_configs_across_problems_compares_relative_times():
    # Two routings at one M: the skewed one is slower for every config, so raw minima would only ever
    # look at the uniform rows. Config a wins uniform by 1 %, but loses skewed by 30 %: b is the better pick.
    a, b = tile(16), tile(32)
    rows = [
        row(64, a, 99.0), row(64, b, 100.0),
        row(64, a, 260.0, routing="skewed"), row(64, b, 200.0, routing="skewed"),
    ]
    table = best_configs(pd.DataFrame(rows))[TABLE]
    score_a = (99.0 / 99.0 + 260.0 / 200.0) / 2
    score_b = (100.0 / 99.0 + 200.0 / 200.0) / 2
    assert score_b < score_a
    assert table[64] == b


# ---- the files an export writes ----------------------------------------------------------------

META = {"device_name": "NVIDIA H200", "interpreter": False, "torch": "2.11.0+cu130", "triton": "3.6.0"}


def table_rows(tables: dict[tuple, ConfigTable]) -> pd.DataFrame:
    """Rows whose best configs are ``tables``: each table's config at each M timed fastest, another slower."""
    rows = []
    for (E, N, dtype, device), table in tables.items():
        for m, cfg in table.items():
            slower = tile(256 if cfg.BLOCK_SIZE_M != 256 else 128)
            over = dict(experts=E, intermediate=N, dtype=dtype, device_name=device)
            rows += [row(m, cfg, 10.0, **over), row(m, slower, 20.0, **over)]
    return pd.DataFrame(rows)


def export(tables: dict[tuple, ConfigTable], out: Path, layout: str = "vllm", **kw) -> list[Path]:
    """The table files ``export_run`` writes for rows whose best configs are ``tables`` (the sidecar left out)."""
    done = export_run(META, table_rows(tables), out, layout=layout, **kw)
    assert done.files[-1] == out / SIDECAR
    return list(done.files[:-1])


def some_tables() -> dict[tuple, ConfigTable]:
    return {
        TABLE: sample_table(),
        (256, 256, "fp8-block128", "NVIDIA H200"): ConfigTable({1: tile(16), 64: tile(64)}),
    }


def test_the_rows_pick_the_tables_the_export_tests_write():
    """The precondition of the tests below: ``table_rows`` picks back exactly the tables it was built from."""
    assert best_configs(table_rows(some_tables())) == some_tables()


def test_vllm_export_writes_loadable_files(tmp_path):
    tables = some_tables()
    paths = export(tables, tmp_path)
    assert sorted(paths) == sorted(tmp_path / vllm.file_name(E, N, dev, dt) for (E, N, dt, dev) in tables)
    for (E, N, dtype, device), table in tables.items():
        path = tmp_path / vllm.file_name(E, N, device, dtype)
        assert ConfigTable.from_json(path) == table
        assert json.loads(path.read_text())["triton_version"] == META["triton"]
        assert engine_lookup(path.read_text(), 3) == table.nearest(3).to_vllm_dict()
    # no temp files left
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(p.name for p in paths), SIDECAR])


def test_sglang_export_goes_under_configs_and_the_engines_triton(tmp_path):
    """SGLang reads $SGLANG_MOE_CONFIG_DIR/configs/triton_<x_y_z>/<name>, and turns every key into an int:
    its files carry no "triton_version" entry."""
    tables = some_tables()
    paths = export(tables, tmp_path, layout="sglang", engine_triton="3.8.0")
    for (E, N, dtype, device), table in tables.items():
        path = tmp_path / "configs" / "triton_3_8_0" / sglang.file_name(E, N, device, dtype)
        assert path in paths
        assert ConfigTable.from_json(path) == table
        assert all(key.isdigit() for key in json.loads(path.read_text()))
    assert any("[128, 128]" in p.name for p in paths)


def test_sglang_default_folder_is_sglang_0_5_23s_triton(tmp_path):
    [path] = export({TABLE: sample_table()}, tmp_path, layout="sglang")
    assert sglang.ENGINE_TRITON == "3.8.0"  # SGLang 0.5.23 runs Triton 3.8; triton.__version__ prints "3.8.0"
    assert path.parent == tmp_path / "configs" / "triton_3_8_0"


@pytest.mark.parametrize("version", [
    "3.8",  # not what triton.__version__ prints: SGLang would never find triton_3_8
    "3.8.0+git1234",  # SGLang's fallback reads folder names as integers and would fail on this one
    "v3.8.0", "", "3.8.0.1",
])
def test_bad_engine_triton_is_a_user_error_before_writing(tmp_path, version):
    with pytest.raises(UserError, match="X.Y.Z"):
        sglang.folder(tmp_path / "out", version)
    if version:  # the export reads an empty --engine-triton as "not given": the default folder
        with pytest.raises(UserError, match="X.Y.Z"):
            export({TABLE: sample_table()}, tmp_path / "out", layout="sglang", engine_triton=version)
    assert not (tmp_path / "out").exists()


def test_an_export_replaces_an_existing_file(tmp_path):
    [path] = export({TABLE: sample_table()}, tmp_path)
    newer = ConfigTable({1: tile(64)})
    assert export({TABLE: newer}, tmp_path) == [path]
    assert ConfigTable.from_json(path) == newer


def test_an_export_refuses_two_tables_for_one_file_before_writing(tmp_path):
    # vLLM names fp8-tensor and fp8-channel tables alike: one would silently overwrite the other.
    tables = {
        (8, 14336, "fp8-tensor", "NVIDIA H200"): sample_table(),
        (8, 14336, "fp8-channel", "NVIDIA H200"): sample_table(),
    }
    with pytest.raises(UserError, match="both map to"):
        export(tables, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # SGLang tells them apart (per_channel_quant), so there both are written
    assert len(export(tables, tmp_path / "sg", layout="sglang")) == 2


def test_an_export_in_an_unknown_layout_writes_nothing(tmp_path):
    with pytest.raises(UserError, match="layout"):
        export(some_tables(), tmp_path, layout="trtllm")
    assert list(Path(tmp_path).iterdir()) == []


# ---- the registry of formats ---------------------------------------------------------------------

@pytest.mark.parametrize("layout", list(FORMATS))
def test_every_format_defines_what_the_export_reads(layout):
    """``export_run`` reads these of every format module; a module missing one would fail only when exported."""
    fmt = FORMATS[layout]
    for name in ("READER", "PATH", "ENV_VAR", "ENGINE_TRITON", "HINT"):
        assert hasattr(fmt, name), f"{layout}: no {name}"
    for name in ("folder", "file_name", "file_text"):
        assert callable(getattr(fmt, name, None)), f"{layout}: no {name}()"
    assert fmt.PATH in PATHS, f"{layout}: PATH {fmt.PATH!r} is no path"


def test_export_configs_offers_every_format_as_a_layout():
    from moebench.cli.tune import export_configs

    (layout,) = [p for p in export_configs.params if p.name == "layout"]
    assert list(layout.type.choices) == list(FORMATS)
