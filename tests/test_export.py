"""export-configs end to end on synthetic run folders: the engines' files from triton-classic rows (final
re-timings where a tune has them), found where vLLM and SGLang look; moebench's own tables; the sidecar; errors."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from helpers import moebench_in_process

from moebench.cli import main as cli
from moebench.errors import UserError
from moebench.store.rows import Row
from moebench.store.runfolder import RunWriter, load_run, run_ref
from moebench.tables.export import SIDECAR
from moebench.tables.formats import moebench as tiles
from moebench.tables.formats import sglang, vllm
from moebench.tables.formats.moebench import FORMAT, VERSION, TableMeta, load_table, table_text
from moebench.tables.pick import best_configs
from moebench.tables.table import ConfigTable
from moebench.tile import DEFAULTS, TileConfig

# vLLM's benchmark_moe.py default batch sizes: what a default tune covers
VLLM_BATCH_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
SHAPE = dict(model="mixtral-8x7b", experts=8, hidden=4096, intermediate=14336, topk=2, moe_layers=32)
META = {"device_name": "NVIDIA H200", "interpreter": False, "torch": "2.11.0+cu130", "triton": "3.6.0",
        "git_commit": "abc1234"}
CLASSIC = [TileConfig(bm, 64, 128, 1, 4, 3) for bm in (16, 32, 64, 128)]
# moebench's kernel: between them, every field away from its default (checked in the round-trip test)
OWN = [
    TileConfig(64, 128, 64, 8, 8, 4, swap_ab=True, split_k=2, direct_route=True, gemm2_block_n=64,
               gemm1_merged=True, gemm1_quant_x=True, gemm2_split_k=2, atomic_out=True, gemm2_columns_first=True,
               gemm2_preload=True),
    TileConfig(32, 64, 128, 4, 4, 2, atomic_sum=False, gemm2_n_tiles=2, gemm1_tma=True, tail_tiles=1),
]


def tune_rows(path: str, candidates: list[TileConfig], ms=VLLM_BATCH_SIZES) -> list[dict]:
    """A tune's rows at each M: every candidate screened (the first at M index i the fastest there), the two
    best re-timed in the final phase (where the order flips, every time above the screen's), one candidate that
    failed to compile."""
    rows = []
    for i, M in enumerate(ms):
        first, second = candidates[i % len(candidates)], candidates[(i + 1) % len(candidates)]

        def r(cfg, t, phase, M=M, **over):
            return Row(**SHAPE, M=M, dtype="bf16", path=path, routing="uniform", seed=0, config=cfg.as_dict(),
                       correct=t is not None, time_us=t, device_name="NVIDIA H200", phase=phase, **over).as_dict()

        rows += [r(cfg, 100.0 + j, "screen") for j, cfg in enumerate([first, second, *candidates])]
        rows += [r(first, 120.0, "final"), r(second, 110.0, "final")]  # slower than the screen: longer timings
        rows.append(r(candidates[0], None, "screen", status="error", failure="compile", error="compile failed"))
    return rows


def final_winners(rows: list[dict]) -> dict[int, TileConfig]:
    """The fastest final-phase config per M, read straight from the rows."""
    best: dict[int, dict] = {}
    for r in rows:
        if r["phase"] != "final" or r["status"] != "ok":
            continue
        if r["M"] not in best or r["time_us"] < best[r["M"]]["time_us"]:
            best[r["M"]] = r
    return {m: TileConfig.from_dict(r["config"]) for m, r in best.items()}


def write_run(folder: Path, rows: list[dict], **meta) -> Path:
    writer = RunWriter(folder, {**META, **meta})
    for r in rows:
        writer.append(r)
    writer.finish()
    return folder


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, list[str], list[str]]:
    """``moebench ARGS`` in this process, through the entry point that turns errors into exit 2."""
    monkeypatch.setattr(sys, "argv", ["moebench", *args])
    with pytest.raises(SystemExit) as info:
        cli.main()
    out = capsys.readouterr()
    return info.value.code, out.out.splitlines(), [line for line in out.err.splitlines() if line.strip()]


@pytest.fixture
def tune_run(tmp_path) -> tuple[Path, list[dict]]:
    """A tune's run folder: triton-classic and triton rows at vLLM's 18 batch sizes."""
    classic = tune_rows("triton-classic", CLASSIC)
    return write_run(tmp_path / "run", classic + tune_rows("triton", OWN)), classic


def engine_lookup(text: str, M: int) -> dict:
    """vLLM's reading of a file and its pick for M tokens (SGLang's pick is the same rule)."""
    tuned = json.loads(text)
    tuned.pop("triton_version", None)
    configs = {int(key): val for key, val in tuned.items()}
    return configs[min(configs.keys(), key=lambda x: abs(x - M))]


def sglang_lookup(config_dir: Path, server_triton: str, name: str) -> dict[int, dict] | None:
    """SGLang's get_moe_configs with SGLANG_MOE_CONFIG_DIR=config_dir on a server running ``server_triton``:
    configs/triton_<x_y_z>/<name>, else the newest other triton_* folder holding it (listing configs/, which
    fails where it does not exist); every key read as an int."""
    def read(p: Path) -> dict[int, dict]:
        return {int(k): v for k, v in json.loads(p.read_text()).items()}

    exact = config_dir / "configs" / f"triton_{server_triton.replace('.', '_')}" / name
    if exact.exists():
        return read(exact)
    versions = sorted((d.name.removeprefix("triton_").replace("_", ".") for d in (config_dir / "configs").iterdir()
                       if d.name.startswith("triton_")), key=lambda v: tuple(int(x) for x in v.split(".")),
                      reverse=True)
    for v in versions:
        p = config_dir / "configs" / f"triton_{v.replace('.', '_')}" / name
        if v != server_triton and p.exists():
            return read(p)
    return None


NAME = vllm.file_name(8, 14336, "NVIDIA H200", "bf16")


def test_vllm_export_takes_the_final_triton_classic_times_at_all_18_M(tune_run, tmp_path, monkeypatch, capsys):
    run, classic = tune_run
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(monkeypatch, capsys, "export-configs", str(run), "--out", str(out))
    assert code == 0, stderr
    assert stdout == [str(out / NAME), str(out / SIDECAR), f"export VLLM_TUNED_CONFIG_FOLDER={out.resolve()}"]
    text = (out / NAME).read_text()
    table = ConfigTable.from_json(text)
    want = final_winners(classic)
    assert list(table) == VLLM_BATCH_SIZES
    assert {m: cfg.to_vllm_dict() for m, cfg in table.items()} == {m: c.to_vllm_dict() for m, c in want.items()}
    screen_first = {m: CLASSIC[i % len(CLASSIC)] for i, m in enumerate(VLLM_BATCH_SIZES)}
    assert all(want[m] != screen_first[m] for m in want)  # the final times, not the screen's, decided
    assert json.loads(text)["triton_version"] == META["triton"]
    for M in range(1, 5000, 7):  # vLLM's nearest-M rule over the written file gives the tuned config
        nearest = min(VLLM_BATCH_SIZES, key=lambda k: abs(k - M))
        assert engine_lookup(text, M) == want[nearest].to_vllm_dict()


@pytest.mark.parametrize("engine_triton, server_triton", [
    (None, "3.8.0"),  # the default: SGLang 0.5.23's Triton
    ("3.6.0", "3.6.0"),
    ("3.6.0", "3.9.0"),  # another server Triton: SGLang falls back to the newest folder there
])
def test_sglang_export_is_found_by_sglangs_lookup(tune_run, tmp_path, monkeypatch, capsys, engine_triton,
                                                  server_triton):
    run, classic = tune_run
    out = tmp_path / "out"
    args = ["export-configs", str(run), "--out", str(out), "--layout", "sglang"]
    if engine_triton:
        args += ["--engine-triton", engine_triton]
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args)
    assert code == 0, stderr
    name = sglang.file_name(8, 14336, "NVIDIA H200", "bf16")
    folder = f"triton_{(engine_triton or sglang.ENGINE_TRITON).replace('.', '_')}"
    assert stdout[0] == str(out / "configs" / folder / name)
    assert stdout[-1] == f"export SGLANG_MOE_CONFIG_DIR={out.resolve()}"
    found = sglang_lookup(out, server_triton, name)
    assert found == {m: cfg.to_vllm_dict() for m, cfg in final_winners(classic).items()}


def test_the_sglang_simulation_fails_where_configs_is_missing(tmp_path):
    """The lookup above reproduces SGLang's FileNotFoundError for files put straight in $SGLANG_MOE_CONFIG_DIR."""
    (tmp_path / "triton_3_8_0").mkdir()
    (tmp_path / "triton_3_8_0" / NAME).write_text("{}")
    with pytest.raises(FileNotFoundError):
        sglang_lookup(tmp_path, "3.8.0", NAME)


def test_moebench_layout_round_trips_every_field(tune_run, tmp_path, monkeypatch, capsys):
    run, _ = tune_run
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(monkeypatch, capsys, "export-configs", str(run), "--out", str(out),
                                   "--layout", "moebench")
    assert code == 0, stderr
    path = out / tiles.file_name(8, 14336, "NVIDIA H200", "bf16")
    assert stdout == [str(path), str(out / SIDECAR)]  # no engine reads it: no environment line
    meta, table = load_table(path)
    _, df = load_run(run)
    assert table == best_configs(df, path="triton")[(8, 14336, "bf16", "NVIDIA H200")]
    assert list(table) == VLLM_BATCH_SIZES and set(table.values()) == set(OWN)
    for f in fields(TileConfig):  # the case really carries every field away from its default
        assert any(getattr(cfg, f.name) != DEFAULTS.get(f.name) for cfg in table.values()) or f.name in (
            "BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"), f.name
    assert (meta.kernel, meta.device_name, meta.dtype, meta.version, meta.warning) == (
        "triton", "NVIDIA H200", "bf16", VERSION, None)
    assert (meta.triton_version, meta.torch_version, meta.commit) == (META["triton"], META["torch"], "abc1234")
    assert meta.shape == {"experts": 8, "intermediate": 14336, "hidden": 4096, "topk": 2}
    assert meta.source_run == "../run" and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta.created)
    assert json.loads(path.read_text())["format"] == FORMAT


def test_sidecar_lists_each_file_and_merges_by_file_name(tune_run, tmp_path, monkeypatch, capsys):
    run, _ = tune_run
    out = tmp_path / "out"
    for layout in ("vllm", "sglang", "moebench"):
        assert run_cli(monkeypatch, capsys, "export-configs", str(run), "--out", str(out), "--layout", layout)[0] == 0
    sidecar = json.loads((out / SIDECAR).read_text())
    files = sidecar["files"]
    sg = f"configs/triton_3_8_0/{sglang.file_name(8, 14336, 'NVIDIA H200', 'bf16')}"
    own = tiles.file_name(8, 14336, "NVIDIA H200", "bf16")
    assert (sidecar["format"], sidecar["version"]) == ("moebench-export", 1)
    assert sorted(files) == sorted([NAME, sg, own])
    assert all((out / name).is_file() for name in files)
    for name, entry in files.items():
        assert entry["kernel"] == ("triton" if name == own else "triton-classic")
        assert (entry["triton_version"], entry["torch_version"], entry["commit"]) == ("3.6.0", META["torch"], "abc1234")
        assert entry["source_run"] == "../run" and entry["device_name"] == "NVIDIA H200"  # from --out, relative
        assert entry["M"] == VLLM_BATCH_SIZES and entry["final_M"] == VLLM_BATCH_SIZES
        assert entry["engine_triton"] == ("3.8.0" if name == sg else None)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry["created"])
    # a later export from another run replaces its own file's entry and keeps the others
    rows = tune_rows("triton-classic", CLASSIC, ms=[1, 64])
    other = write_run(tmp_path / "other", rows, git_commit="def5678")
    assert run_cli(monkeypatch, capsys, "export-configs", str(other), "--out", str(out))[0] == 0
    after = json.loads((out / SIDECAR).read_text())["files"]
    assert after[NAME]["commit"] == "def5678" and after[NAME]["M"] == [1, 64]
    assert {k: v for k, v in after.items() if k != NAME} == {k: v for k, v in files.items() if k != NAME}


def test_an_M_tuned_without_a_timed_config_is_a_warning(tmp_path, monkeypatch, capsys):
    rows = tune_rows("triton-classic", CLASSIC, ms=[1, 2])
    bad = [r for r in tune_rows("triton-classic", CLASSIC, ms=[4096]) if r["status"] != "ok"]  # all failed
    run = write_run(tmp_path / "run", rows + bad)
    code, stdout, stderr = run_cli(monkeypatch, capsys, "export-configs", str(run), "--out", str(tmp_path / "o"))
    assert code == 0
    assert list(ConfigTable.from_json(Path(stdout[0]))) == [1, 2]
    (warning,) = stderr
    assert warning.startswith("warning:") and "M=4096" in warning and "nearest M" in warning


@pytest.mark.parametrize("rows, args, fragment", [
    ("triton", [], "moebench tune --path triton-classic"),  # moebench's kernel only: no engine table
    ("triton", ["--layout", "sglang"], "--layout moebench"),
    ("classic", ["--layout", "moebench"], "no correct, timed triton rows"),
    ("classic", ["--layout", "trtllm"], "'--layout'"),  # unknown layout
    ("classic", ["--layout", "sglang", "--engine-triton", "3.8"], "X.Y.Z"),  # not a release string
    ("classic", ["--layout", "sglang", "--engine-triton", "3.8.0+git1"], "X.Y.Z"),
    ("classic", ["--engine-triton", "3.8.0"], "--layout sglang"),  # names SGLang's folder only
    ("classic", ["--out", "{file}"], "{file} is a file"),
    ("classic", ["--out", "{file}/sub"], "{file} is a file"),
    ("cpu", [], "interpreter"),
])
def test_export_errors_are_one_line_exit_2_and_write_nothing(tmp_path, monkeypatch, capsys, rows, args, fragment):
    file = tmp_path / "taken"
    file.write_text("keep\n")
    made = {"triton": tune_rows("triton", OWN, ms=[1]), "classic": tune_rows("triton-classic", CLASSIC, ms=[1]),
            "cpu": [dict(r, interpreter=True) for r in tune_rows("triton-classic", CLASSIC, ms=[1])]}[rows]
    run = write_run(tmp_path / "run", made, interpreter=rows == "cpu")
    out = tmp_path / "out"
    args = [a.format(file=file) for a in args]
    code, stdout, stderr = run_cli(monkeypatch, capsys, "export-configs", str(run),
                                   *([] if "--out" in args else ["--out", str(out)]), *args)
    assert code == 2 and stdout == []
    (line,) = stderr
    assert line.startswith("error:") and fragment.format(file=file) in line, line
    assert not out.exists() and file.read_text() == "keep\n" and sorted(tmp_path.iterdir()) == [run, file]


def test_a_sidecar_it_cannot_update_stops_the_export_before_writing(tune_run, tmp_path, monkeypatch, capsys):
    run, _ = tune_run
    out = tmp_path / "out"
    out.mkdir()
    (out / SIDECAR).write_text('{"format": "something-else"}\n')
    code, _, stderr = run_cli(monkeypatch, capsys, "export-configs", str(run), "--out", str(out))
    assert code == 2 and SIDECAR in stderr[0] and sorted(p.name for p in out.iterdir()) == [SIDECAR]


def test_help_names_the_default_engine_triton():
    from click.testing import CliRunner

    result = CliRunner().invoke(cli.cli, ["export-configs", "--help"])
    assert result.exit_code == 0 and sglang.ENGINE_TRITON in result.output and "SGLang 0.5.23" in result.output


# ---- moebench's table format -------------------------------------------------------------------

def _table_file(tmp_path: Path, **change) -> Path:
    meta = TableMeta(device_name="NVIDIA H200", dtype="fp8-block128", triton_version="3.6.0",
                     shape={"experts": 256, "intermediate": 256, "hidden": 7168, "topk": 8})
    raw = json.loads(table_text(meta, ConfigTable({1: OWN[0], 64: OWN[1]})))
    raw.update(change)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(raw))
    return path


def test_load_table_reads_back_what_table_text_writes(tmp_path):
    meta, table = load_table(_table_file(tmp_path))
    assert dict(table) == {1: OWN[0], 64: OWN[1]}
    assert meta.shape["hidden"] == 7168 and meta.dtype == "fp8-block128" and meta.warning is None


@pytest.mark.parametrize("change, fragment", [
    ({"format": "vllm"}, "not a moebench-tiles table"),
    ({"format": None}, "not a moebench-tiles table"),
    ({"version": 0}, "version 0"),
    ({"version": "1"}, "version '1'"),
    ({"configs": {"1": {"BLOCK_SIZE_M": 16}}}, "M=1"),
    ({"shape": {"experts": 8}}, "shape lacks"),
])
def test_load_table_refuses_other_formats_and_versions(tmp_path, change, fragment):
    with pytest.raises(UserError) as err:
        load_table(_table_file(tmp_path, **change))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_load_table_refuses_an_engines_file(tmp_path):
    path = tmp_path / NAME
    path.write_text(ConfigTable({1: CLASSIC[0]}).to_json())
    with pytest.raises(UserError, match="no format field"):
        load_table(path)


def test_load_table_warns_on_a_newer_version(tmp_path):
    meta, table = load_table(_table_file(tmp_path, version=VERSION + 1))
    assert meta.warning and f"version {VERSION + 1}" in meta.warning and len(table) == 2
    newer = {"1": dict(OWN[0].as_dict(), a_later_field=1)}
    with pytest.raises(UserError, match="newer"):
        load_table(_table_file(tmp_path, version=VERSION + 1, configs=newer))


def test_moebench_file_names_say_what_they_are():
    name = tiles.file_name(8, 14336, "NVIDIA H200 NVL", "fp8-channel")
    # the documented name: the format first, moebench's dtype name (fp8 schemes apart), the device as recorded
    assert name == "moebench-tiles_E=8,N=14336,device_name=NVIDIA_H200_NVL,dtype=fp8-channel.json"
    assert name != tiles.file_name(8, 14336, "NVIDIA H200 NVL", "fp8-tensor")


# ---- the committed H200 tune of the engines' form --------------------------------------------------------

H200_TUNE = Path(__file__).resolve().parent.parent / "results" / "h200-tune-classic-54407e6"


@pytest.mark.parametrize("layout", ["vllm", "sglang"])
def test_the_committed_h200_tune_exports_qwen3s_table_at_18_M(tmp_path, layout):
    """The committed run (rows gzipped, as it is) exports one file per engine for Qwen3-30B-A3B's experts
    (E=128, N=768), holding the 18 M the tune covered."""
    out = tmp_path / "out"
    done = moebench_in_process("export-configs", str(H200_TUNE), "--out", str(out), "--layout", layout)
    assert done.returncode == 0, done.stderr
    (file,) = [Path(p) for p in done.stdout.splitlines() if p.endswith(".json") and not p.endswith(SIDECAR)]
    assert file.name.startswith("E=128,N=768,") and "H200" in file.name
    assert [int(k) for k in json.loads(file.read_text()) if k.isdigit()] == VLLM_BATCH_SIZES


# ---- an export is written whole or not at all ------------------------------------------------------

def _sidecar_rename_fails(monkeypatch) -> None:
    """Renaming the sidecar into place raises ENOSPC naming no file, as a write on a full disk does."""
    import errno
    import os

    from moebench.store import atomic

    real = os.replace

    def replace(src, dst):
        if Path(dst).name == SIDECAR:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(src, dst)
    monkeypatch.setattr(atomic.os, "replace", replace)


def test_an_export_whose_sidecar_fails_leaves_no_table(tune_run, tmp_path, monkeypatch, capsys):
    """The tables and the sidecar are one write: where the sidecar cannot be placed, no table is left for an
    engine to load without its provenance, nor the folder made for them; the line names the sidecar."""
    run, _ = tune_run
    out = tmp_path / "out"
    _sidecar_rename_fails(monkeypatch)
    code, stdout, stderr = run_cli(monkeypatch, capsys, "export-configs", str(run), "--out", str(out),
                                   "--layout", "sglang")
    assert code == 2 and stdout == [] and stderr == [f"error: {out / SIDECAR}: No space left on device"]
    assert not out.exists() and sorted(tmp_path.iterdir()) == [run]


def test_an_export_that_fails_over_an_earlier_one_leaves_the_earlier_one(tune_run, tmp_path, monkeypatch, capsys):
    """A second export into the same folder fails at its sidecar: the first export's table and sidecar are
    there as they were, and nothing else."""
    run, _ = tune_run
    out = tmp_path / "out"
    assert run_cli(monkeypatch, capsys, "export-configs", str(run), "--out", str(out))[0] == 0
    before = {p: p.read_bytes() for p in out.rglob("*")}
    other = write_run(tmp_path / "other", tune_rows("triton-classic", CLASSIC, ms=[1, 64]), git_commit="def5678")
    _sidecar_rename_fails(monkeypatch)
    assert run_cli(monkeypatch, capsys, "export-configs", str(other), "--out", str(out))[0] == 2
    assert {p: p.read_bytes() for p in out.rglob("*")} == before


@pytest.mark.parametrize("run, folder, named", [
    ("/work/p/results/a-run", "/work/p/configs", "../results/a-run"),  # one tree: the way from the export
    ("/work/p/configs/runs/a-run", "/work/p/configs", "runs/a-run"),  # inside the export's folder
    ("/home/u/results/a-run", "/tmp/configs", "a-run"),  # nothing shared below the root: the folder's name
])
def test_source_run_is_named_from_the_export_folder_never_absolute(run, folder, named):
    assert run_ref(Path(run), Path(folder)) == named
