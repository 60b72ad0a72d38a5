"""`moebench doctor`: each engine's places in its order, over folders the tests make (the engines' packages
faked on sys.path), the key read per serving M, the warning line read back, and the command with its bad inputs."""

from __future__ import annotations

import importlib.util
import json
import shlex

import pytest
from helpers import moebench_in_process

from moebench.dtypes import DTYPES
from moebench.errors import UserError
from moebench.tables import doctor, lookup
from moebench.tables.doctor import Ask, diagnose, server_triton
from moebench.tables.engine_log import parse_log, presets_for
from moebench.tables.formats import FORMATS, sglang, vllm
from moebench.tables.formats.moebench import TableMeta, table_text
from moebench.tables.formats.moebench import file_name as moebench_name
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig

H200 = "NVIDIA H200"
NAME = vllm.file_name(128, 768, H200, "bf16")  # E=128,N=768,device_name=NVIDIA_H200.json: vLLM and SGLang alike
CFG = TileConfig(16, 32, 64, 1, 4, 3)
MS = (1, 8, 20, 40, 64, 100, 4096)
VLLM_OWN = ("model_executor", "layers", "fused_moe", "configs")
SGLANG_OWN = ("srt", "layers", "moe", "moe_runner", "triton_utils")


@pytest.fixture(autouse=True)
def bare_machine(monkeypatch, tmp_path):
    """No engine installed, no variable set, no shipped moebench table: each test adds what it needs."""
    for var in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR", lookup.ENV_VAR):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(lookup, "SHIPPED_DIR", tmp_path / "shipped")
    real = importlib.util.find_spec
    installed: set[str] = set()

    def find_spec(name, *args, **kw):
        if name in ("vllm", "sglang") and name not in installed:
            return None
        return real(name, *args, **kw)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return installed


@pytest.fixture
def install(bare_machine, monkeypatch, tmp_path):
    """install("vllm") makes an importable fixture package of that name; returns its folder."""
    site = tmp_path / "site"

    def make(name: str):
        pkg = site / name
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text("")
        monkeypatch.syspath_prepend(str(site))
        importlib.invalidate_caches()
        bare_machine.add(name)
        return pkg

    return make


def table_file(folder, keys=(1, 16, 64), name=NAME, extra: dict | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    payload = json.loads(ConfigTable({k: CFG for k in keys}).to_json())
    (folder / name).write_text(json.dumps({**payload, **(extra or {})}))
    return folder / name


def one(engine: str, **kw):
    ask = Ask(128, 768, H200, kw.pop("dtype", "bf16"), kw.pop("ms", MS), **kw)
    return diagnose(ask, (engine,))[0]


def labels(finding):
    return [(p.label, p.looked, p.found) for p in finding.places]


def test_every_format_has_a_search():
    assert list(doctor.SEARCHES) == list(FORMATS)


# ---- vLLM: $VLLM_TUNED_CONFIG_FOLDER, then its own configs/ ----

def test_vllm_on_a_bare_machine_looks_nowhere_and_says_why():
    f = one("vllm")
    assert f.file_name == NAME and f.read is None
    assert [(p.label, p.looked, p.note) for p in f.places] == [
        ("$VLLM_TUNED_CONFIG_FOLDER", False, "not set"),
        ("vLLM's own configs/", False, "vLLM is not installed here")]
    assert f.places[1].path.endswith("vllm/model_executor/layers/fused_moe/configs/" + NAME)
    assert all(p.key is None and not p.tuned for p in f.picks)


def test_vllm_reads_its_own_folder_where_the_variable_is_unset(install):
    own = table_file(install("vllm").joinpath(*VLLM_OWN))
    f = one("vllm")
    assert labels(f) == [("$VLLM_TUNED_CONFIG_FOLDER", False, False), ("vLLM's own configs/", True, True)]
    assert f.read == str(own)


def test_vllm_prefers_the_variables_folder_to_its_own(install, monkeypatch, tmp_path):
    table_file(install("vllm").joinpath(*VLLM_OWN), keys=(1,))
    user = table_file(tmp_path / "user", keys=(1, 16, 64))
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path / "user"))
    f = one("vllm")
    assert labels(f) == [("$VLLM_TUNED_CONFIG_FOLDER", True, True), ("vLLM's own configs/", True, True)]
    assert f.read == str(user)
    assert [p.key for p in f.picks] == [1, 1, 16, 16, 64, 64, 64]  # the user's keys, not the own file's single key


def test_vllm_falls_through_an_empty_variable_folder(install, monkeypatch, tmp_path):
    own = table_file(install("vllm").joinpath(*VLLM_OWN))
    (tmp_path / "user").mkdir()
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path / "user"))
    f = one("vllm")
    assert labels(f) == [("$VLLM_TUNED_CONFIG_FOLDER", True, False), ("vLLM's own configs/", True, True)]
    assert f.read == str(own)


# ---- the key each serving M reads ----

def test_each_m_reads_the_nearest_key_ties_to_the_smaller_and_says_whether_it_was_tuned(monkeypatch, tmp_path):
    table_file(tmp_path, keys=(1, 16, 64))
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    f = one("vllm")
    # worked by hand: 8 is 7 from 1 and 8 from 16; 40 is 24 from both 16 and 64 (the first key wins)
    assert [(p.m, p.key, p.tuned) for p in f.picks] == [
        (1, 1, True), (8, 1, False), (20, 16, False), (40, 16, False), (64, 64, True), (100, 64, False),
        (4096, 64, False)]


def test_a_file_vllm_cannot_read_is_found_and_named_as_broken(monkeypatch, tmp_path):
    (tmp_path / NAME).write_text("{not json")
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    f = one("vllm")
    assert f.read == str(tmp_path / NAME) and f.picks == ()
    assert any("cannot use the file" in n for n in f.notes)


# ---- SGLang: configs/triton_<x_y_z>/ of the server's Triton, then the other versions, newest first ----

def test_sglang_falls_back_to_other_triton_folders_newest_first_by_number(monkeypatch, tmp_path):
    root = tmp_path / "sg"
    table_file(root / "configs" / "triton_3_8_0")
    newest = table_file(root / "configs" / "triton_3_10_0")  # newer than 3_8_0 by number, older by letters
    (root / "configs" / "triton_3_2_0").mkdir()
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(root))
    f = one("sglang", engine_triton="3.9.0")
    assert [p.label for p in f.places] == [
        "$SGLANG_MOE_CONFIG_DIR, configs/triton_3_9_0", "$SGLANG_MOE_CONFIG_DIR, fallback configs/triton_3_10_0",
        "$SGLANG_MOE_CONFIG_DIR, fallback configs/triton_3_8_0",
        "$SGLANG_MOE_CONFIG_DIR, fallback configs/triton_3_2_0"]
    assert [p.found for p in f.places] == [False, True, True, False]
    assert f.read == str(newest)


def test_sglang_reads_the_servers_triton_folder_first(monkeypatch, tmp_path):
    root = tmp_path / "sg"
    table_file(root / "configs" / "triton_3_10_0")
    exact = table_file(root / "configs" / "triton_3_8_0")
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(root))
    f = one("sglang", engine_triton="3.8.0", shape_flags="--model qwen3-30b-a3b")
    assert f.read == str(exact)
    assert "--engine-triton 3.8.0" in f.command


def test_sglang_variable_replaces_its_own_folder(install, monkeypatch, tmp_path):
    table_file(install("sglang").joinpath(*SGLANG_OWN, "configs", "triton_3_9_0"))
    (tmp_path / "sg" / "configs").mkdir(parents=True)
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(tmp_path / "sg"))
    f = one("sglang", engine_triton="3.9.0")
    assert f.read is None  # the package's file is there, and SGLang does not look
    assert all(str(tmp_path / "sg") in p.path for p in f.places)
    assert any("replaces SGLang's own folder" in n for n in f.notes)


def test_sglang_reads_its_own_folder_where_the_variable_is_unset(install):
    pkg = install("sglang")
    own = table_file(pkg.joinpath(*SGLANG_OWN, "configs", "triton_3_9_0"))
    f = one("sglang", engine_triton="3.9.0")
    assert labels(f) == [("$SGLANG_MOE_CONFIG_DIR", False, False),
                         ("SGLang's own folder, configs/triton_3_9_0", True, True)]
    assert f.read == str(own)


def test_sglang_older_package_layout_is_found(install):
    pkg = install("sglang")
    old = table_file(pkg / "srt" / "layers" / "moe" / "fused_moe_triton" / "configs" / "triton_3_1_0")
    f = one("sglang", engine_triton="3.9.0")
    assert f.read == str(old)


def test_sglang_without_sglang_still_names_its_triton_folder():
    f = one("sglang", engine_triton="3.9.0")
    assert f.read is None and f.places[-1].looked is False
    assert f.places[-1].path.endswith(f"configs/triton_3_9_0/{NAME}")


@pytest.mark.parametrize("make, says", [
    (lambda root: root.mkdir(), "does not exist"),  # no configs/: SGLang's listing fails
    (lambda root: (root / "configs" / "triton_3_8_0+git").mkdir(parents=True), "does not read as triton_"),
])
def test_sglang_folders_it_fails_on_are_named(monkeypatch, tmp_path, make, says):
    make(tmp_path / "sg")
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(tmp_path / "sg"))
    assert any(says in n for n in one("sglang", engine_triton="3.9.0").notes)


def test_sglang_file_with_a_triton_version_entry_is_flagged(monkeypatch, tmp_path):
    table_file(tmp_path / "sg" / "configs" / "triton_3_9_0", extra={"triton_version": "3.9.0"})
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(tmp_path / "sg"))
    f = one("sglang", engine_triton="3.9.0")
    assert f.read is not None and any("triton_version" in n for n in f.notes)


def test_server_triton_is_the_given_else_the_one_default_export_configs_has_too(monkeypatch):
    """Not the Triton installed here: doctor's answer and the export's folder follow one default."""
    import importlib.metadata

    from moebench.cli.tune import export_configs

    assert server_triton("3.7.1")[0] == "3.7.1"
    with pytest.raises(UserError, match="X.Y.Z"):
        server_triton("3.9")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "3.9.0")
    assert server_triton(None)[0] == sglang.ENGINE_TRITON
    help_text = " ".join(export_configs.get_help(export_configs.make_context("export-configs", ["r"])).split())
    assert f"[default: {sglang.ENGINE_TRITON}" in help_text


# ---- moebench: $MOEBENCH_CONFIGS, then the shipped tables ----

def write_moebench(folder, keys):
    meta = TableMeta(device_name=H200, dtype="bf16", shape={"experts": 128, "intermediate": 768, "hidden": 2048,
                                                            "topk": 8})
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / moebench_name(128, 768, H200, "bf16")
    path.write_text(table_text(meta, ConfigTable({k: CFG for k in keys})))
    return path


def test_moebench_prefers_its_variable_to_the_shipped_tables(monkeypatch, tmp_path):
    write_moebench(tmp_path / "shipped", (1, 4096))
    mine = write_moebench(tmp_path / "mine", (1, 20))
    assert one("moebench").read == str(tmp_path / "shipped" / mine.name)
    monkeypatch.setenv(lookup.ENV_VAR, str(tmp_path / "mine"))
    f = one("moebench")
    assert labels(f) == [("$MOEBENCH_CONFIGS", True, True), ("moebench's shipped tables", True, True)]
    assert f.read == str(mine) and [p.key for p in f.picks if p.tuned] == [1, 20]


# ---- the command that makes the file ----

@pytest.mark.parametrize("engine", list(FORMATS))
def test_the_command_takes_only_flags_the_real_commands_take(engine, monkeypatch):
    from moebench.cli.tune import export_configs, tune

    monkeypatch.setenv(FORMATS[engine].ENV_VAR or lookup.ENV_VAR, "/srv/tables")
    f = one(engine, dtype="fp8-block128", shape_flags="--model qwen3-235b-a22b --tp 2", engine_triton="3.9.0")
    tune_part, export_part = f.command.split(" && ")
    tune_args, export_args = shlex.split(tune_part)[2:], shlex.split(export_part)[2:]
    tune_ctx = tune.make_context("tune", tune_args)
    assert (tune_ctx.params["model"], tune_ctx.params["tp"], tune_ctx.params["dtype"]) == (
        "qwen3-235b-a22b", 2, "fp8-block128")
    assert tune_ctx.params["path_name"] == FORMATS[engine].PATH
    export_ctx = export_configs.make_context("export-configs", export_args)
    assert export_ctx.params["layout"] == engine and str(export_ctx.params["out_dir"]) == "/srv/tables"
    assert export_ctx.params["run"].as_posix().startswith("$(ls -td " + doctor.TUNE_OUT)


def test_no_command_without_a_shape_or_a_dtype_moebench_tunes():
    assert one("vllm", shape_flags=None).command is None
    assert one("vllm", dtype=None, shape_flags="--model x", names={"vllm": NAME}).command is None


# ---- the warning line read back ----

VLLM_LINE = ("WARNING 06-01 21:42:14 [fused_moe.py:1071] Using default MoE config. Performance might be "
             "sub-optimal! Config file not found at {}")
SGLANG_LINE = ("Using default MoE kernel config. Performance might be sub-optimal! Config file not found at {}, you "
               "can create them with https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe")


@pytest.mark.parametrize("paths, dirs", [
    ("/x/" + NAME, ("/x",)),  # one path
    (f"/u/{NAME}, /site/vllm/configs/{NAME}", ("/u", "/site/vllm/configs")),  # ", "-joined: the variable set
    (f"['/site/vllm/configs/{NAME}']", ("/site/vllm/configs",)),  # a Python list
])
def test_vllm_warning_lines_of_each_form(paths, dirs):
    got = parse_log(VLLM_LINE.format(paths))
    assert (got.engine, got.name, got.dirs) == ("vllm", NAME, dirs)
    assert (got.experts, got.n, got.device_name, got.dtype) == (128, 768, H200, "bf16")


def test_sglang_warning_line_gives_its_triton_and_block_shape():
    name = sglang.file_name(256, 256, H200, "fp8-block128")
    got = parse_log(SGLANG_LINE.format(f"/sg/configs/triton_3_8_0/{name}"))
    assert (got.engine, got.engine_triton, got.block_shape, got.dtype) == ("sglang", "3.8.0", (128, 128),
                                                                         "fp8-block128")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_file_name_reads_back_to_a_dtype_of_the_same_name(engine, dtype):
    name = FORMATS[engine].file_name(64, 1408, "NVIDIA H200 NVL", dtype)
    got = parse_log(name)
    assert (got.experts, got.n, got.name) == (64, 1408, name)
    assert FORMATS[engine].file_name(got.experts, got.n, got.device_name, got.dtype) == name


@pytest.mark.parametrize("name, why", [
    ("E=8,N=7168,device_name=NVIDIA_H200,dtype=int4_w4a16.json", "dtype=int4_w4a16"),
    ("E=8,N=7168,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[64,64].json", "64x64"),
])
def test_names_moebench_cannot_tune_have_no_dtype_and_say_why(name, why):
    got = parse_log(VLLM_LINE.format(name))
    assert got.dtype is None and why in got.why


@pytest.mark.parametrize("text, says", [
    ("Using default W8A8 Block FP8 kernel config. Config file not found at /c/N=4096,K=1024,device_name=L40S.json",
     "no config file name"),
    (f"/a/{NAME} /b/{vllm.file_name(8, 64, H200, 'bf16')}", "2 different files"),
])
def test_lines_naming_no_file_or_two_are_refused(text, says):
    with pytest.raises(UserError, match=says):
        parse_log(text)


def test_presets_for_a_kernel_shape_list_each_sharding_that_gives_it():
    found = presets_for(128, 768)
    assert found[0] == ("qwen3-30b-a3b", 1, 1) and ("qwen3-235b-a22b", 2, 1) in found
    assert presets_for(3, 5) == []


# ---- the command line ----

def test_done_when_qwen3_on_an_h200_named_from_a_cpu():
    done = moebench_in_process("doctor", "--model", "qwen3-30b-a3b", "--dtype", "bf16", "--device-name", H200,
                               "--engine-triton", "3.8.0")
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())  # rich may fold long cells
    assert f"vLLM looks up {NAME}" in out and f"SGLang looks up {NAME}" in out
    assert "configs/triton_3_8_0/" in done.stdout.replace("\n", "").replace("│", "").replace(" ", "")
    assert "not looked: not set" in out and "make it:" in out
    assert ("moebench tune --model qwen3-30b-a3b --dtype bf16 --path triton-classic --out results/tunes && "
            "moebench export-configs") in out


def test_json_output_holds_every_engine_and_the_file_found(monkeypatch, tmp_path):
    table_file(tmp_path, keys=(16, 4096))
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    done = moebench_in_process("doctor", "--model", "qwen3-235b", "--tp", "2", "--device-name", "NVIDIA H200 NVL",
                               "--m", "16,100", "--format", "json")
    assert done.returncode == 0, done.stderr
    engines = {e["engine"]: e for e in json.loads(done.stdout)["engines"]}
    assert list(engines) == list(FORMATS)
    assert engines["vllm"]["read"] == str(tmp_path / NAME)  # vLLM folds "H200 NVL" into NVIDIA_H200
    assert engines["vllm"]["picks"] == [{"m": 16, "key": 16, "tuned": True}, {"m": 100, "key": 16, "tuned": False}]
    assert "--model qwen3-235b-a22b --tp 2" in engines["vllm"]["command"]
    assert "NVIDIA_H200_NVL" in engines["sglang"]["file_name"]


def test_from_log_answers_for_the_file_and_finds_the_preset(monkeypatch, tmp_path):
    done = moebench_in_process("doctor", "--from-log", VLLM_LINE.format(f"{tmp_path}/{NAME}"), "--format", "json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert [e["engine"] for e in got["engines"]] == ["vllm"]
    vllm_finding = got["engines"][0]
    assert vllm_finding["file_name"] == NAME and vllm_finding["read"] is None
    assert vllm_finding["places"][-1]["path"] == f"{tmp_path}/{NAME}"  # the folder the log names, looked at here
    assert "--model qwen3-30b-a3b --dtype bf16" in vllm_finding["command"]
    assert any("qwen3-235b-a22b at --tp 2" in n for n in got["notes"])
    table_file(tmp_path)  # the file now there: found where the log said
    again = json.loads(moebench_in_process("doctor", "--from-log", VLLM_LINE.format(f"{tmp_path}/{NAME}"),
                                           "--format", "json").stdout)
    assert again["engines"][0]["read"] == f"{tmp_path}/{NAME}"


@pytest.mark.parametrize("args, says", [
    ((), "give a shape"),
    (("--model", "nope", "--device-name", H200), "unknown model"),
    (("--model", "qwen3-30b-a3b", "--hf-config", "c.json", "--device-name", H200), "one shape"),
    (("--model", "qwen3-30b-a3b", "--dtype", "int4", "--device-name", H200), "unknown dtype"),
    (("--model", "qwen3-30b-a3b", "--m", "a,b", "--device-name", H200), "--m"),
    (("--model", "qwen3-30b-a3b", "--ep", "3", "--device-name", H200), "not divisible"),
    (("--model", "qwen3-30b-a3b", "--engine-triton", "3.9", "--device-name", H200), "X.Y.Z"),
    (("--model", "qwen3-30b-a3b"), "no CUDA GPU here"),
    (("--from-log", "nothing here"), "no config file name"),
    (("--from-log", NAME, "--device-name", "NVIDIA H100"), "the log names"),
    (("--from-log", NAME, "--model", "mixtral-8x7b"), "E=8,N=14336"),
    (("--from-log", NAME, "--dtype", "fp8-tensor"), "not named for it"),
    (("--from-log", SGLANG_LINE.format(NAME), "--engine", "vllm"), "not vLLM's warning"),
])
def test_bad_input_is_one_line_and_exit_2(args, says, monkeypatch):
    import moebench._interpret

    monkeypatch.setattr(moebench._interpret, "cuda_available", lambda: False)  # no GPU, even on one
    done = moebench_in_process("doctor", *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_from_log_of_sglang_follows_sglang_under_the_triton_its_folder_names():
    name = sglang.file_name(256, 256, H200, "fp8-block128")
    done = moebench_in_process("doctor", "--from-log", SGLANG_LINE.format(f"/sg/configs/triton_3_7_0/{name}"),
                               "--format", "json")
    assert done.returncode == 0, done.stderr
    (finding,) = json.loads(done.stdout)["engines"]
    assert (finding["engine"], finding["file_name"]) == ("sglang", name)
    assert any(p["label"].endswith("configs/triton_3_7_0") for p in finding["places"])
    assert "3.7.0 (the log's folder)" in " ".join(finding["notes"])
    assert finding["command"].startswith("moebench tune --model deepseek-v3 --tp 8 --dtype fp8-block128")
    assert finding["command"].endswith("--layout sglang --engine-triton 3.7.0")


def test_doctor_under_a_histogram_says_the_share_of_batches_between_keys(tmp_path, monkeypatch):
    """--m-weights: M=3 falls between a table's keys 2 and 4 and reads 2, a key tuned at another M; the share
    is its batches over all; an engine without a file says so (share None)."""
    write_moebench(tmp_path / "shipped", (1, 2, 4, 4096))
    (tmp_path / "h.csv").write_text("1,100\n3,10\n4096,1\n")
    proc = moebench_in_process("doctor", "--model", "qwen3-30b-a3b", "--dtype", "bf16", "--device-name",
                               "NVIDIA H200", "--engine", "all", "--m-weights", str(tmp_path / "h.csv"),
                               "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    by_engine = {e["engine"]: e for e in json.loads(proc.stdout)["engines"]}
    assert by_engine["moebench"]["between_keys"] == {"batches": 111.0, "share": pytest.approx(10 / 111)}
    assert [p["m"] for p in by_engine["moebench"]["picks"]] == [1, 3, 4096]  # the histogram's counts, not vLLM's 18
    assert by_engine["vllm"]["read"] is None and by_engine["vllm"]["between_keys"]["share"] is None


def test_doctor_loads_no_torch():
    """doctor is host code: asked with --device-name it answers without importing torch (a fresh process)."""
    import subprocess
    import sys

    code = ("import sys; from click.testing import CliRunner; import moebench.cli.main as m; "
            "r = CliRunner().invoke(m.cli, ['doctor', '--model', 'qwen3-30b-a3b', '--dtype', 'bf16', "
            "'--device-name', 'NVIDIA H200', '--format', 'json']); "
            "print(r.exit_code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split()[-2:] == ["0", "False"], out.stdout + out.stderr
