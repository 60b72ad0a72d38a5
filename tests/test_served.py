"""The served catalog behind `moebench tune-tables`: every entry names a preset, a dtype and a TP degree the
kernel can run, no two entries write the same table file, the filters select what they name, and the command
lists the entries anywhere but refuses to tune without a GPU, writing nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from moebench._interpret import interpreting
from moebench.cli.main import cli
from moebench.dtypes import get_dtype
from moebench.errors import UserError
from moebench.models import get_model, model_names
from moebench.tables.formats.moebench import file_name
from moebench.tune.served import PATH, SERVED, select
from moebench.tune.strategies import fast


def test_every_entry_is_a_preset_dtype_and_tp_the_kernel_runs():
    for e in SERVED:
        shape, spec = e.shape, get_dtype(e.dtype)
        assert e.model == get_model(e.model).name, f"{e.name}: not a canonical preset name"
        assert shape.intermediate * e.tp == get_model(e.model).intermediate, f"{e.name}: TP does not divide"
        if spec.fp8_scheme == "block128":
            assert shape.intermediate % 128 == 0 and shape.hidden % 128 == 0, f"{e.name}: not whole blocks"
        assert e.why


def test_every_preset_but_the_made_up_one_is_served_and_each_table_is_written_once():
    served = {e.model for e in SERVED}
    assert served == set(model_names()) - {"tiny"}
    names = [file_name(e.shape.experts, e.shape.intermediate, "NVIDIA H200", e.dtype) for e in SERVED]
    assert len(names) == len(set(names))
    assert all(any(e.model == m and e.dtype == "bf16" for e in SERVED) for m in served if not m.startswith(
        ("deepseek", "kimi"))), "a model whose bf16 checkpoint fits on H200s lacks its bf16 entry"


def test_each_unserved_entry_is_a_benchmark_point_dtype():
    """An entry no checkpoint is served in is there for the benchmark points' dtype, and says so."""
    import yaml

    spec = yaml.safe_load((Path(__file__).parent.parent / "sweeps" / "h200-kernels.yaml").read_text())
    points = {(m, d) for run in spec["runs"] for m in run["models"] for d in run["dtypes"]}
    extra = [e for e in SERVED if not e.served]
    assert extra and all((e.model, e.dtype) in points and e.why.startswith("not served") for e in extra)
    assert not any((e.model, e.dtype) == (x.model, x.dtype) for x in extra for e in SERVED if e.served)


def test_the_served_paths_defaults_are_fast_strategy_options():
    """tune-tables runs the default strategy with the path's own defaults: each is an option of it."""
    defaults = fast.PATH_DEFAULTS[PATH]
    opts = fast.Options(**defaults)  # a name the strategy lacks raises TypeError
    assert all(getattr(opts, k) == v for k, v in defaults.items())


def test_select_filters_by_model_alias_and_dtype():
    assert [e.dtype for e in select(["mixtral"])] == ["bf16", "fp8-tensor-static", "fp8-tensor"]
    assert {e.model for e in select([], ["fp8-block128"])} == {"deepseek-v3", "kimi-k2", "qwen3-30b-a3b",
                                                                "qwen3-235b-a22b"}
    assert select() == list(SERVED)
    with pytest.raises(UserError, match="tiny has no served entry"):
        select(["tiny"])
    with pytest.raises(UserError, match="no served entry for deepseek-v3 in bf16"):
        select(["deepseek-v3"], ["bf16"])


def test_list_prints_every_entry():
    result = CliRunner().invoke(cli, ["tune-tables", "--list"], terminal_width=300)
    assert result.exit_code == 0, result.output
    for e in SERVED:
        assert e.model in result.output and e.dtype in result.output


@pytest.mark.skipif(not interpreting(), reason="describes a machine without a CUDA GPU")
def test_without_a_gpu_it_refuses_in_one_line_and_writes_nothing(tmp_path):
    into = tmp_path / "tables"
    proc = subprocess.run([sys.executable, "-m", "moebench", "tune-tables", "--model", "qwen3-30b-a3b", "--into",
                           str(into), "--out", str(tmp_path / "runs")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "no CUDA GPU" in proc.stderr
    assert not into.exists() and not (tmp_path / "runs").exists()


REFUSED_AS_ON_A_GPU = [
    (("--model", "nope"), "unknown model"),
    (("--model", "qwen3-30b-a3b", "--m", "0"), "token counts must be positive"),
    (("--model", "qwen3-30b-a3b", "--gpus", "0"), "--gpus 0"),
    (("--model", "qwen3-30b-a3b", "--into", "{file}/tables"), "a file is in the way"),
]


@pytest.mark.parametrize("args,says", REFUSED_AS_ON_A_GPU, ids=[" ".join(a) for a, _ in REFUSED_AS_ON_A_GPU])
def test_a_refusal_as_on_a_gpu_creates_no_out_folder(tmp_path, monkeypatch, args, says):
    """With the GPU check passed (interpreting() stands in as False), each refused argument is one line, exit 2,
    before any tune starts, and a fresh --out (and --into) stays uncreated."""
    from helpers import moebench_in_process

    def no_tune(*a, **k):
        raise AssertionError("a tune started")

    monkeypatch.setattr("moebench._interpret.interpreting", lambda: False)
    monkeypatch.setattr("moebench.tune.run.tune", no_tune)
    (tmp_path / "f").write_text("")
    fresh = tmp_path / "fresh"
    args = [a.replace("{file}", str(tmp_path / "f")) for a in args]
    if "--into" not in args:
        args += ["--into", str(fresh / "tables")]
    proc = moebench_in_process("tune-tables", *args, "--out", str(fresh / "runs"), "--no-progress")
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not fresh.exists()


def test_an_unknown_dtype_is_one_line_naming_it_and_the_known_ones(tmp_path):
    """`tune-tables --dtype nope` names the unknown dtype and lists the table's dtypes (not "any model in nope"),
    exit 2, and creates nothing."""
    from helpers import moebench_in_process

    from moebench.dtypes import DTYPES

    proc = moebench_in_process("tune-tables", "--dtype", "nope", "--into", str(tmp_path / "t"), "--out",
                               str(tmp_path / "r"), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert "unknown dtype 'nope'" in line and all(name in line for name in DTYPES)
    assert list(tmp_path.iterdir()) == []
