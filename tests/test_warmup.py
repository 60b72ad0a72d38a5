"""Warming ahead of serving: the plan (every M of 1..max_tokens at the config the lookup gives it: a table's
nearest key, else the heuristic; the same launch at two M kept once), its runs in workers, failures listed, new
kernels counted in a Triton-like cache folder, and the command. Each test holds on the interpreter and on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from moebench._interpret import interpreting
from moebench.cli.main import cli
from moebench.cli.warmup import warmup as warmup_command
from moebench.environment import device_name
from moebench.errors import UserError
from moebench.kernels.fused_moe import DeviceFacts, LayerShapes, launch_plan
from moebench.models import get_model
from moebench.paths.registry import get_path
from moebench.problem import Problem
from moebench.serve.triton_cache import CACHE_ENV, kernel_entries
from moebench.serve.warmup import launch_key, plan_for_model, plan_for_table, warm
from moebench.tables import lookup
from moebench.tables.formats.moebench import TableMeta, file_name, table_text
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig
from moebench.workers import jobs

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
    path = folder / file_name(8, 64, device_name(), dtype)
    path.write_text(table_text(meta, ConfigTable(configs)))
    return path


@pytest.fixture(autouse=True)
def no_env_or_shipped(monkeypatch, tmp_path):
    monkeypatch.delenv(lookup.ENV_VAR, raising=False)
    monkeypatch.setattr(lookup, "SHIPPED_DIR", tmp_path / "shipped")  # empty: shipped tables never interfere


def first_of_each_launch(shapes, dtype, config_at, max_tokens):
    """The plan a warmup must give, worked out apart from it: over every M of 1..max_tokens, the config the
    lookup would run there and its launch key on each shape; the first M of each distinct key."""
    first = {}
    for M in range(1, max_tokens + 1):
        cfg = config_at(M)
        first.setdefault(tuple(launch_key(s, dtype, M, cfg) for s in shapes), (M, cfg))
    return tuple(sorted(first.values(), key=lambda p: p[0]))


def test_a_table_file_gives_each_m_its_nearest_key_on_its_shape(tmp_path):
    """M=1..8 read key 1, 9..136 key 16 (136 is as near 256: the smaller key wins, as the lookup reads it),
    137.. key 256; within key 16 the align step changes kernel past 128 slots (M=65)."""
    path = write(tmp_path, {1: A, 16: B, 256: C})
    plan = plan_for_table(path, max_tokens=300)
    assert plan.items == ((1, A), (9, B), (65, B), (137, C)) and plan.dropped == 300 - 4
    assert [ConfigTable({1: A, 16: B, 256: C}).nearest_key(M) for M in (8, 9, 136, 137)] == [1, 16, 16, 256]
    (shape,) = plan.shapes
    assert (shape.experts, shape.hidden, shape.intermediate, shape.topk) == (8, 128, 64, 2)
    assert plan.dtype == "fp32" and plan.source == str(path) and plan.notes == () and plan.max_tokens == 300


def test_a_table_picked_across_shapes_warms_each_of_them(tmp_path):
    """Hidden size and top-k are constexprs of the kernels: each listed value compiles kernels of its own."""
    plan = plan_for_table(write(tmp_path, {1: A, 16: B}, hidden=[128, 256], topk=[1, 2]))
    assert {(s.hidden, s.topk) for s in plan.shapes} == {(128, 1), (128, 2), (256, 1), (256, 2)}
    assert plan.runs == 4 * len(plan.items)


@pytest.mark.parametrize("table, hidden, dtype", [
    ({1: A, 16: B, 256: C}, 128, "fp32"),
    ({1: A, 48: B, 64: A, 1500: C}, 128, "fp16"),  # A again past B: the same launch as before, kept once
    ({1: A, 16: B}, [128, 256], "fp32"),  # two shapes: the sums stop being zeroed by GEMM1 at 2049 and 1025
])
def test_a_table_plan_covers_every_launch_up_to_max_tokens(tmp_path, table, hidden, dtype):
    plan = plan_for_table(write(tmp_path, table, dtype=dtype, hidden=hidden))
    assert plan.max_tokens == 4096
    nearest = ConfigTable(table).nearest
    assert plan.items == first_of_each_launch(plan.shapes, dtype, nearest, 4096)
    assert all(cfg == nearest(M) for M, cfg in plan.items)
    assert plan.dropped == 4096 - len(plan.items)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_the_heuristic_plan_covers_every_launch_up_to_max_tokens(dtype):
    heuristic = get_path("triton").default_config
    plan = plan_for_model(TINY, dtype, max_tokens=3000)
    assert plan.source == "heuristic" and plan.max_tokens == 3000
    expected = first_of_each_launch((TINY,), dtype, lambda M: heuristic(Problem(TINY, M, dtype)), 3000)
    assert plan.items == expected and plan.dropped == 3000 - len(expected)
    assert len({cfg for _, cfg in plan.items}) > 1 and len(plan.items) > len({cfg for _, cfg in plan.items})
    assert {launch_key(TINY, dtype, M, heuristic(Problem(TINY, M, dtype))) for M in range(1, 3001)} == {
        launch_key(TINY, dtype, M, cfg) for M, cfg in plan.items}


@pytest.mark.parametrize("table, max_tokens, kept", [
    ({1: A, 16: A}, 16, (1,)),  # 2..32 slots: one-program align, sums zeroed by GEMM1 throughout: one launch
    ({1: A, 100: A}, 100, (1, 65)),  # past 128 slots: the align step's other kernel
    ({1: A, 4096: A}, 4096, (1, 65, 2049)),  # past 1 MiB of top-k sums: zeroed by a launch, not by GEMM1
])
def test_one_config_is_kept_once_per_launch_it_makes(tmp_path, table, max_tokens, kept):
    plan = plan_for_table(write(tmp_path, table), max_tokens)
    assert tuple(M for M, _ in plan.items) == kept and plan.dropped == max_tokens - len(kept)
    keys = [launch_key(TINY, "fp32", M, A) for M in range(1, max_tokens + 1)]
    assert [M for M in range(1, max_tokens + 1) if M == 1 or keys[M - 1] != keys[M - 2]] == list(kept)


def test_the_launch_key_sees_the_zeroing_flag_change():
    """Precondition of the 4096 case above: the launch plan itself differs, not only its grid sizes."""
    def zero(M):
        shapes = LayerShapes(M, 8, 128, 64, 2, out_dtype=Problem(TINY, M, "fp32").spec.act)
        return launch_plan(A, None, shapes, DeviceFacts(pdl=False, interpreting=False)).zero
    assert zero(2048) == "gemm1" and zero(2049) == "launch"


def test_an_unrunnable_config_is_kept_once_at_its_first_m(tmp_path):
    plan = plan_for_table(write(tmp_path, {1: BAD, 16: BAD}))
    assert launch_key(TINY, "fp32", 1, BAD) is None
    assert plan.items == ((1, BAD),)
    plan = plan_for_table(write(tmp_path, {1: A, 16: BAD}), max_tokens=100)
    assert plan.items == ((1, A), (9, BAD))


def test_a_model_warms_the_table_the_lookup_picks_else_the_heuristic(tmp_path, monkeypatch):
    mine = write(tmp_path / "mine", {1: A, 64: B})
    env = write(tmp_path / "env", {1: C, 64: A})
    monkeypatch.setenv(lookup.ENV_VAR, str(tmp_path / "env"))
    plan = plan_for_model(TINY, "fp32", tmp_path / "mine", max_tokens=64)
    assert plan.source == f"configs:{mine.name}" and plan.items == ((1, A), (33, B))
    plan = plan_for_model(TINY, "fp32", max_tokens=64)
    assert plan.source == f"env:{env.name}" and plan.items == ((1, C), (33, A))
    monkeypatch.delenv(lookup.ENV_VAR)
    plan = plan_for_model(TINY, "fp32", max_tokens=64)
    heuristic = get_path("triton").default_config
    assert plan.source == "heuristic" and plan.items[0] == (1, heuristic(Problem(TINY, 1, "fp32")))
    assert all(cfg == heuristic(Problem(TINY, M, "fp32")) for M, cfg in plan.items)


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_a_plan_needs_at_least_one_token(tmp_path, max_tokens):
    with pytest.raises(UserError, match="at least 1"):
        plan_for_model(TINY, "fp32", max_tokens=max_tokens)
    with pytest.raises(UserError, match="at least 1"):
        plan_for_table(write(tmp_path, {1: A}), max_tokens)


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
    """On the interpreter nothing is compiled; on a GPU the kernels counted are those the fresh cache folder
    holds after (this process may hold some variants in memory already, so not a fixed number)."""
    plan = plan_for_table(write(tmp_path, {1: A, 16: B, 100: C}), max_tokens=100)
    assert plan.items == ((1, A), (9, B), (59, C), (65, C))  # past 128 slots the align step's kernel changes
    ran, real = [], jobs.first_run

    def recorded(path_name, problem, config):
        ran.append((problem.M, config))
        return real(path_name, problem, config)

    monkeypatch.setattr(jobs, "first_run", recorded)
    cache = tmp_path / "cache"
    report = warm(plan, jobs=0, cache_dir=cache)
    assert sorted(ran, key=lambda p: p[0]) == list(plan.items)
    assert report.interpreter == interpreting() and report.failures == () and report.configs == 4
    assert report.kernels == (0 if interpreting() else len(kernel_entries(cache)))


def test_workers_run_each_config_and_list_the_one_that_cannot_run(tmp_path):
    """Two workers; the config the scheme refuses comes back as one line naming its M, the rest run."""
    plan = plan_for_table(write(tmp_path, {1: A, 16: B, 32: BAD}), max_tokens=40)
    assert plan.items == ((1, A), (9, B), (25, BAD))
    cache = tmp_path / "cache"
    seen = []
    before = os.environ.get(CACHE_ENV)
    report = warm(plan, jobs=2, cache_dir=cache, on_progress=lambda what, done, total: seen.append((done, total)))
    assert report.configs == 3 and report.interpreter == interpreting()
    assert report.kernels == 0 if interpreting() else report.kernels > 0  # fresh workers, an empty folder
    (failure,) = report.failures
    assert "M=25" in failure and "gemm1_quant_x" in failure
    assert seen[-1] == (3, 3) and report.cache_dir == str(cache) and cache.is_dir()
    assert os.environ.get(CACHE_ENV) == before  # the workers' cache folder is not left set here


def test_a_failing_worker_is_listed_not_raised(tmp_path, monkeypatch):
    plan = plan_for_table(write(tmp_path, {1: A, 16: B}), max_tokens=16)
    boom = (None,) * 5 + ("error", "RuntimeError: boom")
    monkeypatch.setattr(jobs, "first_run", lambda path_name, problem, config: boom if problem.M == 9 else jobs.RAN)
    report = warm(plan, jobs=0)
    assert report.failures == (f"{plan.name} M=9 {B.label}: RuntimeError: boom",)


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
    plan = plan_for_table(write(tmp_path, {1: A, 16: B, 100: C}), max_tokens=60)
    assert len(plan.items) == 3
    cache = tmp_path / "cache"
    _kernel(cache, "old")

    def compiles(path_name, problem, config):
        for name in ("_gemm1_swiglu", "_gemm2_combine"):
            _kernel(Path(os.environ[CACHE_ENV]), name)
        return jobs.RAN

    monkeypatch.setattr(jobs, "first_run", compiles)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "elsewhere"))
    report = warm(plan, jobs=0, cache_dir=cache)
    assert report.kernels == 2 * 3 and len(kernel_entries(cache)) == 2 * 3 + 1
    assert os.environ[CACHE_ENV] == str(tmp_path / "elsewhere")


def invoke(*args: str):
    return CliRunner().invoke(warmup_command, list(args))


def test_the_command_prints_one_summary_line_and_says_it_was_a_dry_run(tmp_path):
    result = invoke("--model", "tiny", "--dtype", "fp32", "--max-tokens", "16", "--no-progress", "--jobs", "0",
                    "--cache-dir", str(tmp_path / "cache"))
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    assert line.startswith("warmed 1 config of tiny fp32 for 1..16 tokens (heuristic): ")
    assert ("dry run" in result.stderr) == interpreting()
    if interpreting():
        assert ": 0 kernels compiled in " in line


def test_the_command_gives_the_report_as_json(tmp_path):
    path = write(tmp_path, {1: A, 16: B})
    result = invoke("--table", str(path), "--jobs", "0", "--no-progress", "--format", "json",
                    "--cache-dir", str(tmp_path / "cache"), "--max-tokens", "70")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["configs"] == 3 and got["m"] == [1, 9, 65] and got["source"] == str(path)
    assert got["max_tokens"] == 70 and got["same_launch_m"] == 70 - 3
    assert got["failures"] == [] and got["interpreter"] is interpreting()
    assert got["cache_dir"] == str(tmp_path / "cache")


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


@pytest.mark.skipif("warmup" not in cli.commands, reason="the command is registered in cli/main.py")
def test_the_registered_command_end_to_end(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), CACHE_ENV: str(tmp_path / "cache")}

    def moebench(*args):
        return subprocess.run([sys.executable, "-m", "moebench", "warmup", *args], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=300)

    done = moebench("--model", "tiny", "--dtype", "fp32", "--max-tokens", "16", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("warmed 1 config of tiny fp32 for 1..16 tokens (heuristic): ")
    bad = moebench("--model", "no-such-model", "--dtype", "fp32")
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown model") and len(bad.stderr.splitlines()) == 1
    zero = moebench("--model", "tiny", "--dtype", "fp32", "--max-tokens", "0")
    assert zero.returncode == 2 and zero.stdout == "" and len(zero.stderr.splitlines()) == 1
    assert zero.stderr.startswith("error: ") and "--max-tokens" in zero.stderr and "0" in zero.stderr


def test_a_table_for_another_device_is_warmed_with_a_note(tmp_path):
    path = write(tmp_path, {1: A})
    other = tmp_path / "other.json"
    meta = TableMeta(device_name="NVIDIA B200", dtype="fp32",
                     shape={"experts": 8, "intermediate": 64, "hidden": 128, "topk": 2})
    other.write_text(table_text(meta, ConfigTable({1: A})))
    assert plan_for_table(path).notes == ()
    (note,) = plan_for_table(other).notes
    assert "NVIDIA B200" in note and device_name() in note
