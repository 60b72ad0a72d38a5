"""Warming a tile table ahead of serving: the plan (a table's keys, the lookup's table, else the heuristic; the
same launch at two M kept once), its runs in workers on the interpreter, failures listed, new kernels counted
in a Triton-like cache folder, and the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from moebench import lookup, precompile
from moebench.cli import cli
from moebench.cli_warmup import warmup as warmup_command
from moebench.configs import ConfigTable
from moebench.environment import device_name
from moebench.errors import UserError
from moebench.kernels.fused_moe import DeviceFacts, LayerShapes, launch_plan
from moebench.models import get_model
from moebench.paths import get_path
from moebench.problem import Problem
from moebench.tables import TableMeta, table_file_name, write_table
from moebench.tile import TileConfig
from moebench.triton_cache import CACHE_ENV, kernel_entries
from moebench.warmup import launch_key, plan_for_model, plan_for_table, warm

ROOT = Path(__file__).resolve().parent.parent
TINY = get_model("tiny")  # E=8, hidden 128, I=64, topk 2
A = TileConfig(16, 32, 32, 1, 2, 2)  # three configs that differ from each other and from the heuristic
B = TileConfig(32, 32, 64, 1, 4, 2)
C = TileConfig(16, 64, 64, 1, 4, 2)
BAD = TileConfig(16, 64, 128, gemm1_quant_x=True, direct_route=True)  # gemm1_quant_x is for fp8-block128 only


def write(folder: Path, configs: dict, dtype: str = "fp32", hidden=128, topk=2) -> Path:
    meta = TableMeta(device_name=device_name(), dtype=dtype,
                     shape={"experts": 8, "intermediate": 64, "hidden": hidden, "topk": topk})
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / table_file_name(8, 64, device_name(), dtype)
    write_table(path, meta, ConfigTable(configs))
    return path


@pytest.fixture(autouse=True)
def no_env_or_shipped(monkeypatch, tmp_path):
    monkeypatch.delenv(lookup.ENV_VAR, raising=False)
    monkeypatch.setattr(lookup, "SHIPPED_DIR", tmp_path / "shipped")  # empty: shipped tables never interfere


def test_a_table_file_gives_every_key_on_its_shape(tmp_path):
    path = write(tmp_path, {1: A, 16: B, 256: C})
    plan = plan_for_table(path)
    assert plan.items == ((1, A), (16, B), (256, C)) and plan.dropped == ()
    (shape,) = plan.shapes
    assert (shape.experts, shape.hidden, shape.intermediate, shape.topk) == (8, 128, 64, 2)
    assert plan.dtype == "fp32" and plan.source == str(path) and plan.notes == ()


def test_a_table_picked_across_shapes_warms_each_of_them(tmp_path):
    """Hidden size and top-k are constexprs of the kernels: each listed value compiles kernels of its own."""
    plan = plan_for_table(write(tmp_path, {1: A, 16: B}, hidden=[128, 256], topk=[1, 2]))
    assert {(s.hidden, s.topk) for s in plan.shapes} == {(128, 1), (128, 2), (256, 1), (256, 2)}
    assert plan.runs == 4 * 2


@pytest.mark.parametrize("table, kept", [
    ({1: A, 16: A}, (1,)),  # 2 and 32 slots: one-program align, sums zeroed by GEMM1 at both: one launch
    ({1: A, 16: B}, (1, 16)),  # another config: always kept
    ({1: A, 100: A}, (1, 100)),  # 200 slots: the align step's other kernel
    ({1: A, 4096: A}, (1, 4096)),  # 2 MiB of top-k sums: zeroed by a launch, not by GEMM1 (another constexpr)
])
def test_the_same_config_at_another_m_is_kept_once_only_where_its_launch_is_the_same(tmp_path, table, kept):
    plan = plan_for_table(write(tmp_path, table))
    assert tuple(M for M, _ in plan.items) == kept
    assert set(plan.dropped) == set(table) - set(kept)
    (m1, m2), (c1, c2) = table, table.values()
    same = launch_key(TINY, "fp32", m1, c1) == launch_key(TINY, "fp32", m2, c2)
    assert same == (len(kept) == 1)  # the case is what it says: the key tells the two launches apart or not


def test_the_launch_key_sees_the_zeroing_flag_change():
    """Precondition of the 4096 case above: the launch plan itself differs, not only its grid sizes."""
    def zero(M):
        shapes = LayerShapes(M, 8, 128, 64, 2, out_dtype=Problem(TINY, M, "fp32").spec.act)
        return launch_plan(A, None, shapes, DeviceFacts(pdl=False, interpreting=False)).zero
    assert zero(1) == "gemm1" and zero(4096) == "launch"


def test_an_unrunnable_config_is_never_taken_for_the_same_launch(tmp_path):
    plan = plan_for_table(write(tmp_path, {1: BAD, 16: BAD}))
    assert launch_key(TINY, "fp32", 1, BAD) is None
    assert [M for M, _ in plan.items] == [1, 16]


def test_a_model_warms_the_table_the_lookup_picks_else_the_heuristic(tmp_path, monkeypatch):
    mine = write(tmp_path / "mine", {1: A, 64: B})
    env = write(tmp_path / "env", {1: C, 64: A})
    monkeypatch.setenv(lookup.ENV_VAR, str(tmp_path / "env"))
    plan = plan_for_model(TINY, "fp32", tmp_path / "mine")
    assert plan.source == f"configs:{mine.name}" and plan.items == ((1, A), (64, B))
    plan = plan_for_model(TINY, "fp32")
    assert plan.source == f"env:{env.name}" and plan.items == ((1, C), (64, A))
    monkeypatch.delenv(lookup.ENV_VAR)
    ms = (1, 16, 100, 4096)
    plan = plan_for_model(TINY, "fp32", ms=ms)
    heuristic = get_path("triton").default_config
    assert plan.source == "heuristic"
    assert sorted([M for M, _ in plan.items] + list(plan.dropped)) == list(ms)
    assert all(cfg == heuristic(Problem(TINY, M, "fp32")) for M, cfg in plan.items)
    assert plan.dropped == (16,)  # the heuristic's M=1 tile again, in the same launch


@pytest.mark.parametrize("make, match", [
    (lambda d: d / "missing.json", "cannot read table"),
    (lambda d: _text(d / "vllm.json", json.dumps({"1": A.to_vllm_dict()})), "not a moebench-tiles table"),
    (lambda d: write(d, {}), "no tile configs"),
])
def test_a_table_warmup_cannot_use_is_one_line(tmp_path, make, match):
    with pytest.raises(UserError, match=match):
        plan_for_table(make(tmp_path))


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_configs_folder_that_is_not_one_is_one_line(tmp_path):
    with pytest.raises(UserError, match="no such folder"):
        plan_for_model(TINY, "fp32", tmp_path / "missing")


def test_in_process_each_config_runs_once(tmp_path, monkeypatch):
    plan = plan_for_table(write(tmp_path, {1: A, 16: B, 100: C}))
    ran, real = [], precompile.run_candidate

    def recorded(path_name, problem, config):
        ran.append((problem.M, config))
        return real(path_name, problem, config)

    monkeypatch.setattr(precompile, "run_candidate", recorded)
    report = warm(plan, jobs=0)
    assert sorted(ran) == sorted(plan.items, key=lambda p: p[0])
    assert report.interpreter and report.kernels == 0 and report.failures == () and report.configs == 3


def test_workers_run_each_config_and_list_the_one_that_cannot_run(tmp_path):
    """Two workers; the config the scheme refuses comes back as one line naming its M, the rest run."""
    plan = plan_for_table(write(tmp_path, {1: A, 16: B, 32: BAD}))
    cache = tmp_path / "cache"
    seen = []
    before = os.environ.get(CACHE_ENV)
    report = warm(plan, jobs=2, cache_dir=cache, on_progress=lambda what, done, total: seen.append((done, total)))
    assert report.configs == 3 and report.interpreter and report.kernels == 0
    (failure,) = report.failures
    assert "M=32" in failure and "gemm1_quant_x" in failure
    assert seen[-1] == (3, 3) and report.cache_dir == str(cache) and cache.is_dir()
    assert os.environ.get(CACHE_ENV) == before  # the workers' cache folder is not left set here


def test_a_failing_worker_is_listed_not_raised(tmp_path, monkeypatch):
    plan = plan_for_table(write(tmp_path, {1: A, 16: B}))
    monkeypatch.setattr(precompile, "run_candidate",
                        lambda path_name, problem, config: "RuntimeError: boom" if problem.M == 16 else None)
    report = warm(plan, jobs=0)
    assert report.failures == (f"{plan.name} M=16 {B.label}: RuntimeError: boom",)


def _kernel(cache: Path, name: str) -> None:
    """One compiled kernel as Triton lays it out: a folder (its hash) with metadata, group file and binary."""
    folder = cache / uuid.uuid4().hex
    folder.mkdir(parents=True)
    (folder / f"{name}.json").write_text("{}")
    (folder / f"__grp__{name}.json").write_text('{"child_paths": {}}')
    (folder / f"{name}.cubin").write_bytes(b"\0")


def test_kernels_are_counted_by_their_metadata_files(tmp_path):
    cache = tmp_path / "cache"
    _kernel(cache, "_gemm1_swiglu")
    (cache / "launcher").mkdir()
    (cache / "launcher" / "__triton_launcher.so").write_bytes(b"\0")  # no metadata: not a kernel
    (cache / "tuned").mkdir()
    (cache / "tuned" / "_gemm1_swiglu.autotune.json").write_text("{}")  # autotuner results: not a kernel
    (entry,) = kernel_entries(cache)
    assert entry.endswith("_gemm1_swiglu.json") and not Path(entry).name.startswith("__grp__")
    assert kernel_entries(tmp_path / "missing") == frozenset()


def test_warm_counts_the_kernels_its_runs_add_to_the_cache_folder_it_names(tmp_path, monkeypatch):
    """A stand-in worker writes two kernels per run into $TRITON_CACHE_DIR as it finds it: the report counts
    those, not the kernel that was there before, so warm did point the runs at the folder it was given."""
    plan = plan_for_table(write(tmp_path, {1: A, 16: B, 100: C}))
    cache = tmp_path / "cache"
    _kernel(cache, "old")

    def compiles(path_name, problem, config):
        for name in ("_gemm1_swiglu", "_gemm2_combine"):
            _kernel(Path(os.environ[CACHE_ENV]), name)

    monkeypatch.setattr(precompile, "run_candidate", compiles)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "elsewhere"))
    report = warm(plan, jobs=0, cache_dir=cache)
    assert report.kernels == 2 * 3 and len(kernel_entries(cache)) == 2 * 3 + 1
    assert os.environ[CACHE_ENV] == str(tmp_path / "elsewhere")


def invoke(*args: str):
    return CliRunner().invoke(warmup_command, list(args))


def test_the_command_prints_one_summary_line_and_says_it_was_a_dry_run():
    result = invoke("--model", "tiny", "--dtype", "fp32", "--m", "1,16", "--no-progress", "--jobs", "0")
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    assert line.startswith("warmed 1 config of tiny fp32 (heuristic): 0 kernels compiled in ")
    assert "dry run" in result.stderr


def test_the_command_gives_the_report_as_json(tmp_path):
    path = write(tmp_path, {1: A, 16: B})
    result = invoke("--table", str(path), "--jobs", "0", "--no-progress", "--format", "json",
                    "--cache-dir", str(tmp_path / "cache"))
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["configs"] == 2 and got["m"] == [1, 16] and got["source"] == str(path)
    assert got["failures"] == [] and got["interpreter"] is True and got["cache_dir"] == str(tmp_path / "cache")


@pytest.mark.parametrize("args, match", [
    (("--model", "no-such-model", "--dtype", "fp32"), "unknown model"),
    (("--table", "missing.json"), "cannot read table"),
    (("--table", "t.json", "--dtype", "fp32"), "without --dtype"),
    (("--model", "tiny", "--dtype", "fp32", "--configs", "missing"), "no such folder"),
    (("--model", "tiny",), "give --dtype"),
    (("--model", "tiny", "--experts", "8", "--dtype", "fp32"), "warm one shape"),
])
def test_bad_input_is_a_user_error(args, match):
    result = invoke(*args, "--no-progress")
    assert isinstance(result.exception, UserError) and match in str(result.exception)


@pytest.mark.skipif("warmup" not in cli.commands, reason="the command is registered in cli.py")
def test_the_registered_command_end_to_end(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), CACHE_ENV: str(tmp_path / "cache")}

    def moebench(*args):
        return subprocess.run([sys.executable, "-m", "moebench", "warmup", *args], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=300)

    done = moebench("--model", "tiny", "--dtype", "fp32", "--m", "1,16", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("warmed 1 config of tiny fp32 (heuristic): 0 kernels")
    bad = moebench("--model", "no-such-model", "--dtype", "fp32")
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown model") and len(bad.stderr.splitlines()) == 1


def test_a_table_for_another_device_is_warmed_with_a_note(tmp_path):
    path = write(tmp_path, {1: A})
    other = tmp_path / "other.json"
    meta = TableMeta(device_name="NVIDIA B200", dtype="fp32",
                     shape={"experts": 8, "intermediate": 64, "hidden": 128, "topk": 2})
    write_table(other, meta, ConfigTable({1: A}))
    assert plan_for_table(path).notes == ()
    (note,) = plan_for_table(other).notes
    assert "NVIDIA B200" in note and device_name() in note
