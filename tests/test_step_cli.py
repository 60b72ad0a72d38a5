"""``moebench step`` on the CPU: a run folder on the tiny models, the tables printed for people and programs, and
bad inputs refused in one line, exit 2, with nothing written."""

from __future__ import annotations

import json

import pytest
from helpers import moebench_in_process

from moebench.store.step_rows import STEP_COLUMNS

SMALL = ("--prompt", "8", "--batch", "2", "--context", "16", "--stack", "2", "--no-progress")


def test_step_writes_a_run_folder_and_prints_the_tables(tmp_path):
    proc = moebench_in_process("step", "--model", "tiny-mla", "--vs", "torch", "--out", str(tmp_path), *SMALL)
    assert proc.returncode == 0, proc.stderr
    (run,) = tmp_path.iterdir()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["kind"] == "step" and meta["status"] == "complete" and meta["interpreter"] is True
    rows = [json.loads(line) for line in (run / "rows.jsonl").read_text().splitlines()]
    assert all(set(STEP_COLUMNS) <= set(r) for r in rows)
    parts = {(r["phase"], r["part"]) for r in rows}
    for phase in ("prefill", "decode"):  # every part of an MLA model with a dense layer and a shared expert
        for part in ("attention", "router", "moe", "shared", "dense_mlp", "head", "allreduce", "stack"):
            assert (phase, part) in parts
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows if r["status"] != "ok"]
    assert [r["measured"] for r in rows if r["part"] == "allreduce"] == [False, False]
    for title in ("ttft: tiny-mla fp16", "decode: tiny-mla fp16", "stack: tiny-mla fp16"):
        assert title in proc.stdout
    assert "not GPU performance" in proc.stdout and "absorbed form" in proc.stderr


def test_step_json_for_programs(tmp_path):
    proc = moebench_in_process("step", "--format", "json", "--out", str(tmp_path), *SMALL)  # tiny, the default
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (ttft,) = doc["ttft"]
    assert ttft["model"] == "tiny" and ttft["prompt"] == 8 and ttft["ttft_ms"] > 0 and ttft["missing"] is None
    (dec,) = doc["decode"]
    assert dec["batch"] == 2 and dec["context"] == 16 and dec["tok_s"] > 0


@pytest.mark.parametrize("args, says", [
    (("--model", "nope"), "unknown model 'nope'"),
    (("--model", "tiny", "--tp", "3"), "attention heads (4) is not divisible by --tp 3"),
    (("--model", "deepseek-v3"), "without a GPU only tiny shapes run"),
    (("--path", "torch", "--vs", "triton"), "--vs triton: not one of the paths run"),
    (("--path", "cutlass"), "path 'cutlass' cannot run any point"),
    (("--path", "nope"), "unknown path 'nope'"),
    (("--batch", "0"), "--batch '0': expected positive integers"),
    (("--context", "10000000000", "--batch", "64"), "needs"),  # the KV cache alone: more than this machine has
    (("--model", "tiny", "--tp", "2", "--ep", "4"), "so --ep equals --tp"),  # EP over the TP group only
    (("--model", "tiny", "--ep", "2"), "--ep 2 with --tp 1"),
    (("--model", "tiny", "--tp", "2", "--ep", "2", "--path", "cutlass"), "path 'cutlass' cannot run any point"),
])
def test_step_refuses_in_one_line_and_writes_nothing(tmp_path, args, says):
    out = tmp_path / "out"
    proc = moebench_in_process("step", "--out", str(out), "--no-progress", *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    assert not out.exists()


def test_step_hf_config_missing_a_field(tmp_path):
    cfg = {"hidden_size": 128, "num_hidden_layers": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
           "intermediate_size": 64, "num_attention_heads": 4}  # no vocab_size
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    proc = moebench_in_process("step", "--hf-config", str(tmp_path / "config.json"), "--out", str(out), *SMALL)
    assert proc.returncode == 2 and "no vocab_size" in proc.stderr and not out.exists()


def _rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "rows.jsonl").read_text().splitlines()]


def test_a_stopped_step_resumes_in_its_folder_and_runs_only_the_rows_it_lacks(tmp_path):
    first = moebench_in_process("step", "--model", "tiny-mla", "--out", str(tmp_path), *SMALL)
    assert first.returncode == 0, first.stderr
    (run,) = tmp_path.iterdir()
    full = _rows(run)
    kept = len(full) // 2  # the first point's rows and part of the second's: a run stopped mid-point
    assert full[kept - 1]["phase"] != full[kept]["phase"] or full[kept - 1]["part"] != "stack"
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in full[:kept]))
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "status": "interrupted", "stopped_by": "SIGTERM"}))

    again = moebench_in_process("step", "--model", "tiny-mla", "--out", str(tmp_path), *SMALL)
    assert again.returncode == 0, again.stderr
    assert [p.name for p in tmp_path.iterdir()] == [run.name]  # the same folder, no second one
    assert f"{kept} rows kept (previous status: interrupted)" in again.stderr
    key = ("phase", "batch", "length", "part", "path")
    resumed = _rows(run)
    assert resumed[:kept] == full[:kept]  # the kept rows untouched
    assert sorted(tuple(r[k] for k in key) for r in resumed) == sorted(tuple(r[k] for k in key) for r in full)
    assert json.loads((run / "meta.json").read_text())["status"] == "complete"

    fresh = moebench_in_process("step", "--model", "tiny-mla", "--out", str(tmp_path), "--fresh", *SMALL)
    assert fresh.returncode == 0 and len(list(tmp_path.iterdir())) == 2  # --fresh: a new folder


def _spec(tmp_path, text: str):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return str(path)


def test_a_step_spec_runs_each_model_into_its_own_folder(tmp_path):
    spec = _spec(tmp_path, "name: two\nprompt: [8]\nbatch: [2]\ncontext: 16\nstack: 0\nmodels:\n"
                           "  - {model: tiny, dtype: fp16, paths: [torch]}\n"
                           "  - {model: tiny-mla, dtype: fp32, paths: [torch], vs: torch}\n")
    out = tmp_path / "out"
    proc = moebench_in_process("step", spec, "--out", str(out), "--format", "json", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert len(doc["runs"]) == 2 and sorted(p.name.split("-step-")[1] for p in out.iterdir()) == [
        "tiny-fp16", "tiny-mla-fp32"]
    ttft = {(r["model"], r["dtype"], r["prompt"]) for r in doc["ttft"]}
    assert ttft == {("tiny", "fp16", 8), ("tiny-mla", "fp32", 8)}
    assert {(r["model"], r["batch"], r["context"]) for r in doc["decode"]} == {("tiny", 2, 16), ("tiny-mla", 2, 16)}
    assert doc["stack"] == []  # stack: 0 in the spec
    assert [r["e2e_vs"] for r in doc["ttft"] if r["model"] == "tiny-mla"] == [1.0]  # vs itself

    again = moebench_in_process("step", spec, "--out", str(tmp_path / "o2"), "--prompt", "4", "--batch", "1",
                                "--format", "json", "--no-progress")  # flags override the spec's points
    assert again.returncode == 0, again.stderr
    assert {r["prompt"] for r in json.loads(again.stdout)["ttft"]} == {4}


@pytest.mark.parametrize("text, args, says", [
    ("models: []\n", (), "models: a non-empty list"),
    ("models:\n  - {model: tiny, flavour: x}\n", (), "unknown key 'flavour'"),
    ("models:\n  - {model: tiny, hf_config: c.json}\n", (), "not both or neither"),
    ("prompt: [0]\nmodels:\n  - {model: tiny}\n", (), "prompt: 0 is not an integer >= 1"),
    ("stack: 65\nmodels:\n  - {model: tiny}\n", (), "stack: 65 is not an integer from 0 to 64"),  # as --stack
    ("models:\n  - {model: tiny}\n  - {model: no-such-model}\n", (), "no-such-model"),  # the second: nothing run
    ("models:\n  - {model: tiny}\n", ("--model", "tiny"), "--model with a step spec"),
])
def test_a_bad_step_spec_is_refused_in_one_line_and_writes_nothing(tmp_path, text, args, says):
    out = tmp_path / "out"
    proc = moebench_in_process("step", _spec(tmp_path, text), "--out", str(out), "--no-progress", *args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_the_shipped_h200_spec_names_the_four_models_at_their_served_shards():
    from moebench.step.spec import find_step_spec, load_step_spec

    spec = load_step_spec(find_step_spec("h200"))
    assert [(e.model, e.tp, e.dtype) for e in spec.entries] == [
        ("deepseek-v3", 8, "fp8-block128"), ("qwen3-30b-a3b", 1, "bf16"), ("mixtral-8x7b", 1, "fp8-tensor"),
        ("gpt-oss-120b", 2, "bf16")]
    assert spec.prompts == (128, 1024, 4096) and spec.batches == (1, 8, 64, 256) and spec.context == 4096
    assert all(e.vs in e.paths for e in spec.entries)


def test_tile_sets_a_field_on_the_triton_paths_chosen_config_and_the_row_says_so(tmp_path):
    proc = moebench_in_process("step", "--path", "triton,torch", "--tile", "swap_ab=on", "--out", str(tmp_path),
                               *SMALL, "--stack", "0")
    assert proc.returncode == 0, proc.stderr
    (run,) = tmp_path.iterdir()
    moe = [r for r in _rows(run) if r["part"] == "moe" and r["path"] == "triton"]
    assert moe and all(r["config"]["swap_ab"] is True and r["config_source"].endswith("swap_ab=True set")
                       for r in moe)
    assert all(r["status"] == "ok" for r in moe), [r["error"] for r in moe]
    assert json.loads((run / "meta.json").read_text())["tile_fields"] == {"swap_ab": True}


@pytest.mark.parametrize("args, says", [
    (("--tile", "swap_ab"), "expected FIELD=VALUE"),
    (("--tile", "colour=1"), "expected FIELD=VALUE"),
    (("--tile", "swap_ab=maybe"), "swap_ab is true or false"),
    (("--tile", "split_k=two"), "split_k is an integer"),
    (("--tile", "swap_ab=off", "--path", "torch"), "--tile sets fields of the triton path's configs"),
])
def test_a_bad_tile_field_is_refused_in_one_line(tmp_path, args, says):
    proc = moebench_in_process("step", "--out", str(tmp_path / "out"), *SMALL, *args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_an_empty_prompt_list_runs_decode_only(tmp_path):
    proc = moebench_in_process("step", "--prompt", "", "--batch", "2", "--context", "16", "--stack", "0",
                               "--out", str(tmp_path), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    (run,) = tmp_path.iterdir()
    assert {r["phase"] for r in _rows(run)} == {"decode"}


def test_triton_classic_reads_the_engine_file_vllm_would_look_up_in_configs(tmp_path):
    """--configs holding the file vLLM looks up for the shape (here an export-like file for this machine's
    device): triton-classic runs its entry nearest M, and the row names the file and key."""
    from moebench.environment import device_name
    from moebench.step.config import get_step
    from moebench.tables.formats import vllm

    moe = get_step("tiny").moe
    configs = tmp_path / "configs"
    configs.mkdir()
    entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, "num_warps": 2,
             "num_stages": 2}
    name = vllm.file_name(moe.experts, moe.intermediate, device_name(), "fp16")
    (configs / name).write_text(json.dumps({"1": entry, "4096": {**entry, "BLOCK_SIZE_M": 64}}))
    proc = moebench_in_process("step", "--path", "triton-classic,torch", "--configs", str(configs),
                               "--out", str(tmp_path / "out"), *SMALL, "--stack", "0")  # the MoE rows alone
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / "out").iterdir()
    moe_rows = [r for r in _rows(run) if r["part"] == "moe" and r["path"] == "triton-classic"]
    assert moe_rows and all(r["status"] == "ok" for r in moe_rows), [r["error"] for r in moe_rows]
    for r in moe_rows:  # M = 8 (prefill) and 2 (decode): both nearest the key 1
        assert {k: r["config"][k] for k in entry} == entry and r["config_source"] == f"configs:{name}@M=1"

    without = moebench_in_process("step", "--path", "triton-classic,torch", "--out", str(tmp_path / "o2"), *SMALL,
                                  "--stack", "0")
    assert without.returncode == 0, without.stderr
    (run,) = (tmp_path / "o2").iterdir()
    assert {r["config_source"] for r in _rows(run) if r["path"] == "triton-classic" and r["part"] == "moe"} == {
        "heuristic"}


def test_expert_parallel_step_runs_the_moe_layer_through_rank_0s_expert_map(tmp_path):
    """tiny at --tp 2 --ep 2: 4 of 8 experts on this GPU, the ids over all 8; the MoE rows check against the
    float32 reference under the same map, and a stack runs the router's real ids through it."""
    proc = moebench_in_process("step", "--model", "tiny", "--tp", "2", "--ep", "2", "--path", "triton,torch",
                               "--out", str(tmp_path), *SMALL)
    assert proc.returncode == 0, proc.stderr
    (run,) = tmp_path.iterdir()
    assert run.name.endswith("-step-tiny@tp2ep2-fp16")
    rows = _rows(run)
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows if r["status"] != "ok"]
    moe = json.loads((run / "meta.json").read_text())["config"]["moe"]
    assert (moe["experts"], moe["global_experts"]) == (4, 8)
    assert {r["part"] for r in rows} >= {"moe", "stack", "allreduce"}
    assert [r["correct"] for r in rows if r["part"] == "moe" and r["path"] == "triton"] == [True, True]
