"""doctor, export and --from-log answer as vLLM and SGLang serve: SGLang's shared-expert fusion of DeepSeek-V3 (its
lookup of E=257), the checkpoint's dtype from quantization_config, each preset's served dtype, "not looked" where an
engine is absent, the Triton a found table was tuned with, and the export's warnings. The engines' file names are
set against their own get_config_file_name, transcribed below."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
from helpers import moebench_in_process
from test_doctor import SGLANG_LINE, bare_machine, install  # noqa: F401  (fixtures: no engine installed, no variable)
from test_export import META, write_run

from moebench.errors import UserError
from moebench.models import FusedShape, checkpoint_dtype, from_hf_config, fuse_shared, get_model, shard
from moebench.problem import Problem, make_inputs
from moebench.store.rows import Row
from moebench.store.runfolder import load_run
from moebench.tables.doctor import Ask, diagnose
from moebench.tables.engine_log import parse_log
from moebench.tables.export import SIDECAR, plan_export
from moebench.tables.fusion import sglang_fuses
from moebench.tile import TileConfig

H200 = "NVIDIA H200"
HF = Path(__file__).parent / "data" / "hf"


def sglang_get_config_file_name(E, N, dtype, block_shape=None, device_name="NVIDIA_H200"):
    """SGLang's own get_config_file_name (fused_moe_triton_config.py): the block shape as Python prints a list."""
    dtype_selector = "" if not dtype else f",dtype={dtype}"
    block_shape_selector = "" if not block_shape or not all(block_shape) else f",block_shape={block_shape}"
    return f"E={E},N={N},device_name={device_name}{dtype_selector}{block_shape_selector}.json"


def vllm_get_config_file_name(E, N, dtype, block_shape=None, device_name="NVIDIA_H200"):
    """vLLM's own get_config_file_name: the block shape without a space."""
    dtype_selector = "" if not dtype else f",dtype={dtype}"
    block_shape_selector = "" if not block_shape or not all(block_shape) else f",block_shape={block_shape}".replace(
        " ", "")
    return f"E={E},N={N},device_name={device_name}{dtype_selector}{block_shape_selector}.json"


DSV3_SGLANG = sglang_get_config_file_name(257, 256, "fp8_w8a8", [128, 128])
DSV3_VLLM = vllm_get_config_file_name(256, 256, "fp8_w8a8", [128, 128])


def doctor_json(*args, cwd=None):
    done = moebench_in_process("doctor", *args, "--format", "json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    return out, {e["engine"]: e for e in out["engines"]}


# ---- DeepSeek-V3@tp8 fp8-block128: SGLang looks up E=257 ----

def test_done_when_deepseek_v3_tp8_under_sglang_is_e257_and_vllm_e256():
    out, by = doctor_json("--model", "deepseek-v3", "--tp", "8", "--device-name", H200)
    assert by["sglang"]["file_name"] == DSV3_SGLANG  # the shared expert fused: 256 + 1
    assert by["vllm"]["file_name"] == DSV3_VLLM
    assert any("fp8-block128" in n and "served" in n for n in out["notes"])  # the preset's served dtype, not bf16
    assert any("E=256+1, top-8+1" in n for n in by["sglang"]["notes"])
    tune_part = by["sglang"]["command"].split(" && ")[0]
    from moebench.cli.tune import tune

    params = tune.make_context("tune", shlex.split(tune_part)[2:]).params
    assert params["shared_fused"] is True and params["dtype"] == "fp8-block128"
    assert "--shared-fused" not in by["vllm"]["command"]


@pytest.mark.parametrize("args, why", [
    (("--disable-shared-experts-fusion",), "runs with --disable-shared-experts-fusion"),  # the server's own flag
    (("--ep", "8"), "expert parallelism"),  # SGLang keeps the shared expert out under EP
])
def test_sglang_without_the_fusion_looks_up_the_routed_experts(args, why):
    _, by = doctor_json("--model", "deepseek-v3", "--tp", "8", "--device-name", H200, *args)
    experts = 256 if "--ep" not in args else 32
    assert by["sglang"]["file_name"] == sglang_get_config_file_name(experts, 256, "fp8_w8a8", [128, 128])
    assert any(why in n for n in by["sglang"]["notes"])


def test_fusion_rule_by_model_and_device():
    dsv3, kimi = shard(get_model("deepseek-v3"), tp=8), shard(get_model("kimi-k2"), tp=8)
    assert sglang_fuses(dsv3, 1, H200)[0] and sglang_fuses(kimi, 1, H200)[0]
    assert fuse_shared(kimi).experts == 385 and fuse_shared(kimi).topk == 9
    assert not sglang_fuses(dsv3, 1, "Tesla V100-SXM2-32GB")[0]  # below compute capability 8.0
    assert sglang_fuses(shard(get_model("llama-4-scout"), tp=2), 1, H200) == (False, "")  # a shared expert, 16 routed


def test_from_log_of_sglangs_e257_line_is_deepseek_v3_at_tp8():
    line = SGLANG_LINE.format(f"/sg/configs/triton_3_8_0/{DSV3_SGLANG}")
    out, by = doctor_json("--from-log", line)
    assert any("deepseek-v3 at --tp 8 with its shared expert" in n for n in out["notes"])
    assert "--model deepseek-v3 --tp 8 --shared-fused" in by["sglang"]["command"]
    _, by = doctor_json("--from-log", line, "--model", "deepseek-v3", "--tp", "8")  # the model given: accepted
    assert by["sglang"]["file_name"] == DSV3_SGLANG


def test_a_fused_shape_routes_every_token_to_the_shared_expert():
    shape = FusedShape("t+shared", 9, 128, 64, 3, 1, 1, fused=1)  # 8 routed + 1 shared, top-2 + 1
    inputs = make_inputs(Problem(shape, 16, "fp16"), "cpu")
    ids = inputs.topk_ids  # [M, 3]
    assert ids.shape == (16, 3) and torch.all(ids[:, -1] == 8) and torch.all(ids[:, :2] < 8)
    with pytest.raises(UserError):
        fuse_shared(get_model("tiny"))  # no shared expert to fuse


def fused_run(folder: Path) -> Path:
    s = fuse_shared(shard(get_model("deepseek-v3"), tp=8))
    rows = [Row(model=s.name, experts=s.experts, hidden=s.hidden, intermediate=s.intermediate, topk=s.topk,
                moe_layers=s.moe_layers, M=M, dtype="fp8-block128", path="triton-classic", routing="uniform", seed=0,
                config=TileConfig(16, 128, 128, 1, 4, 3).as_dict(), correct=True, time_us=100.0, device_name=H200,
                phase="final").as_dict() for M in (1, 64)]
    return write_run(folder, rows, **META)


def test_the_sglang_export_of_a_fused_tune_is_the_file_sglang_reads(tmp_path):
    meta, df = load_run(fused_run(tmp_path / "run"))
    plan = plan_export(meta, df, tmp_path / "out", layout="sglang")
    assert [f.name for f in plan.tables] == [DSV3_SGLANG]
    assert any("SGLang 0.5.23 ships" in w and "--merge-with" in w for w in plan.warnings)  # a plain export shadows
    assert any("Triton 3.6.0" in w and "3.8.0" in w for w in plan.warnings)  # tuned under another Triton
    vllm_plan = plan_export(meta, df, tmp_path / "out", layout="vllm")
    assert any("vLLM runs E=256" in w for w in vllm_plan.warnings)
    quiet = plan_export(meta, df, tmp_path / "out", layout="sglang", engine_triton="3.6.0",
                        merge_with=Path(DSV3_SGLANG))
    assert quiet.warnings == ()


# ---- the checkpoint's dtype ----

def with_quant(tmp_path: Path, quant: dict | None, base: str = "deepseek-v3") -> Path:
    raw = json.loads((HF / base / "config.json").read_text())
    if quant is not None:
        raw["quantization_config"] = quant
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path / "config.json"


@pytest.mark.parametrize("quant, dtype", [
    ({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
     "fp8-block128"),  # DeepSeek-V3's own config.json
    ({"quant_method": "fp8", "activation_scheme": "static"}, "fp8-tensor-static"),  # per tensor, calibrated scales
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8-tensor"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"type": "float", "num_bits": 8, "strategy": "channel"},
        "input_activations": {"type": "float", "num_bits": 8, "dynamic": True}}}}, "fp8-channel"),  # FP8-dynamic
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, None),  # blocks moebench does not tune
    ({"quant_method": "mxfp4"}, None),
    (None, "bf16"),  # torch_dtype bfloat16
])
def test_the_checkpoint_dtype_is_read_from_quantization_config(tmp_path, quant, dtype):
    assert checkpoint_dtype(with_quant(tmp_path, quant))[0] == dtype


def test_done_when_an_fp8_checkpoints_config_json_gets_the_fp8_files(tmp_path):
    config = with_quant(tmp_path, {"quant_method": "fp8", "weight_block_size": [128, 128]})
    assert from_hf_config(config).experts == 256  # the precondition: DeepSeek-V3's shape
    out, by = doctor_json("--hf-config", str(config), "--tp", "8", "--device-name", H200)
    assert by["vllm"]["file_name"] == DSV3_VLLM and by["sglang"]["file_name"] == DSV3_SGLANG
    assert any("quantization_config: fp8" in n for n in out["notes"])


# ---- what doctor knows and could not know ----

def test_an_engine_not_installed_is_not_looked_and_its_shipped_file_named():
    _, by = doctor_json("--model", "qwen3-30b-a3b", "--device-name", H200)
    notes = " ".join(by["vllm"]["notes"])
    assert "not looked" in notes and "vLLM 0.33 ships E=128,N=768,device_name=NVIDIA_H200.json" in notes
    assert "runs its default" not in notes
    gpt = " ".join(doctor_json("--model", "gpt-oss-20b", "--device-name", H200)[1]["vllm"]["notes"])
    assert "does not say it is not shipped" in gpt  # a name moebench's list lacks: not known


def test_a_found_tables_triton_is_shown_and_retime_suggested(monkeypatch, tmp_path):
    (tmp_path / "E=128,N=768,device_name=NVIDIA_H200.json").write_text(
        json.dumps({"1": TileConfig(16, 64, 64, 1, 4, 3).to_vllm_dict(), "triton_version": "3.4.0"}))
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    ask = Ask(128, 768, H200, "bf16", (1,), "3.8.0", "--model qwen3-30b-a3b")
    (f,) = diagnose(ask, ("vllm",))
    assert any("tuned with Triton 3.4.0, the server runs 3.8.0: `moebench retime" in n for n in f.notes)
    (same,) = diagnose(Ask(128, 768, H200, "bf16", (1,), "3.4.0"), ("vllm",))
    assert any("the server's" in n for n in same.notes) and not any("retime" in n for n in same.notes)


# ---- SGLang's lookup where it fails ----

def sglang_finding(monkeypatch, tmp_path, env: str):
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", env)
    monkeypatch.chdir(tmp_path)
    (f,) = diagnose(Ask(128, 768, H200, "bf16", (1,), "3.8.0"), ("sglang",))
    return f


def test_an_empty_sglang_variable_reads_configs_of_the_current_folder(monkeypatch, tmp_path):
    folder = tmp_path / "configs" / "triton_3_8_0"
    folder.mkdir(parents=True)
    (folder / "E=128,N=768,device_name=NVIDIA_H200.json").write_text(
        json.dumps({"1": TileConfig(16, 64, 64, 1, 4, 3).to_vllm_dict()}))
    f = sglang_finding(monkeypatch, tmp_path, "")
    assert f.read == "configs/triton_3_8_0/E=128,N=768,device_name=NVIDIA_H200.json"  # os.path.join("", "configs")


@pytest.mark.parametrize("make", [
    lambda root: root.mkdir(),  # no configs/: listing it raises, the server fails
    lambda root: (root / "configs" / "triton_3_8_0rc1").mkdir(parents=True),  # int("0rc1") raises in the scan
])
def test_sglangs_fallback_scan_that_raises_is_a_failure_not_a_default(monkeypatch, tmp_path, make):
    make(tmp_path / "sg")
    f = sglang_finding(monkeypatch, tmp_path, str(tmp_path / "sg"))
    assert f.read is None and any("raises at this lookup" in n for n in f.notes)
    assert not any("runs its default" in n for n in f.notes)


# ---- the lines the engines print ----

def test_sglangs_fallback_line_names_the_servers_triton_and_the_file_read():
    n = DSV3_SGLANG
    line = (f"Config file not found at /sg/configs/triton_3_8_0/{n}. Fallback to triton version 3.4.0 and use MoE "
            f"kernel config from /sg/configs/triton_3_4_0/{n}. Performance might be sub-optimal!")
    got = parse_log(line)
    assert (got.engine, got.engine_triton, got.used) == ("sglang", "3.8.0", f"/sg/configs/triton_3_4_0/{DSV3_SGLANG}")
    out, by = doctor_json("--from-log", line)
    assert any("the log says SGLang read /sg/configs/triton_3_4_0/" in n for n in by["sglang"]["notes"])
    assert not any("runs its default" in n for n in by["sglang"]["notes"])


def test_vllms_using_configuration_line_is_vllms_and_says_a_file_was_read():
    line = f"INFO [fused_moe.py:900] Using configuration from /site/vllm/configs/{DSV3_VLLM} for MoE layer."
    got = parse_log(line)
    assert (got.engine, got.used) == ("vllm", f"/site/vllm/configs/{DSV3_VLLM}")
    _, by = doctor_json("--from-log", line)
    assert list(by) == ["vllm"] and not any("no file found" in n for n in by["vllm"]["notes"])


# ---- export: the sidecar and --format ----

def test_final_m_lists_the_ms_a_tune_re_timed_against_the_default(tmp_path):
    rows = [Row(model="mixtral-8x7b", experts=8, hidden=4096, intermediate=14336, topk=2, moe_layers=32, M=M,
                dtype="bf16", path="triton-classic", routing="uniform", seed=0, phase=phase,
                config=TileConfig(16, 64, 128, 1, 4, 3).as_dict(), correct=True, time_us=100.0,
                device_name=H200).as_dict() for M in (1, 16) for phase in ("final", "default")]
    done = moebench_in_process("export-configs", str(write_run(tmp_path / "run", rows)), "--out", "out",
                               "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    files = json.loads(done.stdout)["files"]
    assert files[-1].endswith(SIDECAR) and json.loads(done.stdout)["env_line"].startswith("export VLLM_")
    entry = next(iter(json.loads((tmp_path / "out" / SIDECAR).read_text())["files"].values()))
    assert entry["final_M"] == [1, 16]


@pytest.mark.parametrize("args", [("models",), ("tune-tables", "--list")])
@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_lists_print_csv_and_json(args, fmt):
    done = moebench_in_process(*args, "--format", fmt)
    assert done.returncode == 0, done.stderr
    if fmt == "json":
        records = json.loads(done.stdout)
        assert records and "model" in records[0]
    else:
        assert done.stdout.splitlines()[0].startswith("model,")
