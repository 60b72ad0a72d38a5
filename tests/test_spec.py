"""Sweep specs: strict YAML, flags, and the plan they expand to."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import moebench
from moebench.bench.interpreter import for_interpreter
from moebench.bench.spec import (
    GPU_MS,
    INTERPRETER_MS,
    SWEEPS_DIR,
    build_spec,
    default_spec_file,
    find_spec,
    from_options,
    load_spec,
    shipped_specs,
)
from moebench.errors import UserError
from moebench.paths.base import Target

ROOT = Path(__file__).resolve().parent.parent
REPO_SWEEPS = SWEEPS_DIR  # the shipped specs, inside the package
CPU = Target(torch.device("cpu"), True, None)  # the Triton interpreter, whatever this machine has


def _write(tmp_path, text: str):
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return p


def test_shipped_specs_load():
    """Every spec in sweeps/ parses and names only known models, dtypes and paths."""
    specs = sorted(REPO_SWEEPS.glob("*.yaml"))
    assert specs
    for p in specs:
        spec = load_spec(p)
        assert spec.points()


def test_quick_spec_is_the_issue_grid():
    """sweeps/quick.yaml: Mixtral-8x7B and DeepSeek-V3, bf16, five M, triton and cutlass."""
    spec = load_spec(REPO_SWEEPS / "quick.yaml")
    assert {s.name for s in spec.shapes} == {"mixtral-8x7b", "deepseek-v3"}
    assert spec.ms == (1, 16, 128, 1024, 4096) and spec.dtypes == ("bf16",)
    assert set(spec.paths) == {"triton", "cutlass"}
    assert len(spec.points()) == 2 * 5 * 2


def test_points_share_weights_in_order(tmp_path):
    """The plan is grouped by (shape, dtype) so the runner builds each weight set once."""
    spec = load_spec(_write(tmp_path, "models: [tiny, mixtral-8x7b]\nm: [1, 4]\ndtypes: [fp16, fp32]\n"
                                      "paths: [triton, torch]\n"))
    keys = [(p.shape.name, p.dtype) for p, _ in spec.points()]
    changes = sum(1 for a, b in zip(keys, keys[1:]) if a != b)
    assert changes == len(set(keys)) - 1


@pytest.mark.parametrize("text, fragment", [
    ("models: [tiny]\nm: [1]\nbogus: 3\n", "unknown key 'bogus'"),  # strict keys
    ("models: [tiny\nm: [1]\n", "malformed YAML"),  # broken YAML
    ("- tiny\n", "mapping"),  # not a mapping
    ("models: [nosuchmodel]\nm: [1]\n", "unknown model"),  # unknown preset
    ("models: [tiny]\nm: [0]\n", "M must be a token count"),  # impossible M
    ("models: [tiny]\nm: [1]\ntopk: 9\n", "top-k 9 impossible"),  # top-k > experts
    ("models: [tiny]\nm: [1]\ndtypes: [int4]\n", "unknown dtype"),  # unknown dtype
    ("models: [tiny]\nm: [1]\npaths: [magic]\n", "unknown path"),  # unknown path
    ("shapes: [{experts: 8, hidden: 64}]\nm: [1]\n", "missing 'intermediate'"),  # incomplete shape
    ("models: [tiny]\nm: [two]\n", "not an integer"),  # non-numeric M
    ("models: [tiny]\nm: [1]\ntp: two\n", "tp: expected an integer, got 'two'"),  # non-numeric tp
    ("models: [tiny]\nm: [1]\nseed: [1]\n", "seed: expected an integer"),  # a list where an int goes
])
def test_bad_specs_fail_with_one_line(tmp_path, text, fragment):
    with pytest.raises(UserError) as info:
        load_spec(_write(tmp_path, text))
    msg = str(info.value)
    assert fragment in msg and "\n" not in msg and "spec.yaml" in msg


def test_missing_spec_file(tmp_path):
    with pytest.raises(UserError, match="no sweep spec"):
        load_spec(tmp_path / "nope.yaml")


def test_a_spec_that_is_not_text_is_one_line(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_bytes(b"\xff\xfe\x00m")
    with pytest.raises(UserError, match="not UTF-8 text"):
        load_spec(p)


def test_default_specs_ship_inside_the_package():
    """An installed moebench finds its default specs beside its modules (package data), and they load."""
    assert SWEEPS_DIR == Path(moebench.__file__).resolve().parent / "bench" / "sweeps"
    for interpreter, name in ((True, "cpu"), (False, "quick")):
        path = default_spec_file(interpreter)
        assert path.parent == SWEEPS_DIR and path.stem == name and load_spec(path).points()
    assert {"cpu", "quick", "h200-kernels"} <= set(shipped_specs())


def test_the_top_level_sweeps_folder_links_to_the_package():
    """`sweeps/quick.yaml`, as the docs spell it, is the shipped file (a relative link, so a clone keeps it)."""
    link = ROOT / "sweeps"
    assert link.is_symlink() and not Path(link.readlink()).is_absolute()
    assert (link / "quick.yaml").resolve() == (SWEEPS_DIR / "quick.yaml").resolve()


def test_pyproject_ships_the_specs_as_package_data():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "bench/sweeps/*.yaml" in data["tool"]["setuptools"]["package-data"]["moebench"]


def test_a_spec_argument_is_a_file_or_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_spec("quick") == find_spec("quick.yaml") == SWEEPS_DIR / "quick.yaml"
    (tmp_path / "quick.yaml").write_text("models: [tiny]\nm: [1]\n")
    assert find_spec("quick.yaml") == Path("quick.yaml")  # a file of that name comes first
    with pytest.raises(UserError, match="no sweep spec at nope; shipped specs: cpu"):
        find_spec("nope")
    with pytest.raises(UserError, match="no sweep spec"):
        find_spec("elsewhere/quick")  # a name with a folder is a path, not a shipped spec


def test_flags_build_a_plan_with_tp_and_topk_override():
    """--tp divides the intermediate size; --topk replaces the model's own top-k."""
    spec = build_spec("t", models=("deepseek-v3",), ms=(1, 8), topks=(4,), tp=8, paths=("triton",))
    (shape,) = spec.shapes
    assert shape.intermediate == 2048 // 8 and shape.topk == 4
    assert [p.M for p, _ in spec.points()] == [1, 8]


def test_explicit_shape_in_yaml(tmp_path):
    spec = load_spec(_write(tmp_path, "shapes: [{name: mine, experts: 12, hidden: 256, intermediate: 96, "
                                      "topk: 3}]\nm: [2]\ndtypes: [fp32]\npaths: [torch]\n"))
    (shape,) = spec.shapes
    assert (shape.name, shape.experts, shape.hidden, shape.intermediate, shape.topk) == ("mine", 12, 256, 96, 3)


def test_h200_kernel_spec_has_the_35_points_of_the_kernel_goal():
    """Blocks under `runs` inherit the top level: 5 (model, dtype) pairs x 7 M for the triton path."""
    spec = load_spec(REPO_SWEEPS / "h200-kernels.yaml")
    triton = [(p.shape.name, p.dtype, p.M) for p, path in spec.points() if path == "triton"]
    assert len(triton) == len(set(triton)) == 35
    assert {(n, d) for n, d, _ in triton} == {
        ("mixtral-8x7b", "bf16"), ("mixtral-8x7b", "fp8-tensor"), ("qwen3-30b-a3b", "bf16"),
        ("qwen3-30b-a3b", "fp8-block128"), ("deepseek-v3@tp8", "fp8-block128")}
    assert spec.tune and next(s for s in spec.shapes if s.name == "deepseek-v3@tp8").intermediate == 256


def test_runs_entries_are_strict(tmp_path):
    with pytest.raises(UserError, match=r"runs\[0\]: unknown key 'seed'"):
        load_spec(_write(tmp_path, "m: [1]\nruns:\n  - {models: [tiny], seed: 3}\n"))


def test_from_options_explicit_shape_and_flags_over_a_spec():
    """An explicit shape takes the first --topk and sweeps the rest; flags replace a spec file's lists."""
    from moebench.bench.spec import from_options

    plan = from_options(None, REPO_SWEEPS / "cpu.yaml", experts=8, hidden=64, intermediate=32, topk="2,4",
                        ms="1,3", paths="torch")
    assert sorted(s.topk for s in plan.shapes) == [2, 4] and plan.ms == (1, 3) and plan.paths == ("torch",)
    over = from_options(REPO_SWEEPS / "quick.yaml", REPO_SWEEPS / "cpu.yaml", ms="7", dtypes="fp16", tune=True)
    assert over.ms == (7,) and over.dtypes == ("fp16",) and over.tune
    assert {s.name for s in over.shapes} == {"mixtral-8x7b", "deepseek-v3"}
    with pytest.raises(UserError, match="not both"):
        from_options(REPO_SWEEPS / "quick.yaml", REPO_SWEEPS / "cpu.yaml", models=("tiny",))


def test_flags_defaults_become_what_the_interpreter_runs():
    """No --dtype, --path or --m: bf16, cutlass and the GPU's M give way to fp16, torch and small M, said once."""
    plan = from_options(None, default_spec_file(True), models=("tiny",))
    assert plan.dtypes == ("bf16",) and plan.paths == ("triton", "cutlass") and plan.ms == GPU_MS
    cpu, note = for_interpreter(plan, CPU)
    assert cpu.dtypes == ("fp16",) and cpu.paths == ("triton", "torch") and cpu.ms == INTERPRETER_MS
    assert "\n" not in note and all(w in note for w in ("fp16 in place of bf16", "torch in place of cutlass",
                                                         "sm90", "M 1,16,64"))


def test_what_the_user_names_is_kept_on_the_interpreter():
    """Given flags stay as they are (validation then refuses what cannot run, with its reason)."""
    plan = from_options(None, default_spec_file(True), models=("tiny",), dtypes="bf16", paths="triton,cutlass",
                        ms="1,16,128,1024,4096")
    assert for_interpreter(plan, CPU, dtypes_given=True, paths_given=True, ms_given=True) == (plan, None)
    only_dtype, note = for_interpreter(plan, CPU, dtypes_given=True)  # bf16 named: triton stays (and is refused)
    assert only_dtype.dtypes == ("bf16",) and only_dtype.paths == ("triton", "torch") and "bf16" not in note


def test_a_spec_made_for_the_cpu_is_left_alone_and_a_gpu_spec_is_swapped():
    assert for_interpreter(load_spec(default_spec_file(True)), CPU)[1] is None
    kernels, note = for_interpreter(load_spec(REPO_SWEEPS / "h200-kernels.yaml"), CPU)
    assert set(kernels.dtypes) == {"fp16", "fp8-tensor", "fp8-block128"} and set(kernels.paths) == {"triton", "torch"}
    assert note.count("fp16 in place of bf16") == 1  # said once, though two blocks had bf16
    assert kernels.ms == (1, 4, 16, 64, 256, 1024, 4096)  # not the GPU's default list: the spec's own M stay


def test_the_default_sweep_runs_on_the_interpreter_as_it_is():
    """`moebench sweep` with no argument on a CPU: the cpu spec, which every path in it can run there."""
    from moebench.bench.sweep import validate

    plan, note = for_interpreter(from_options(None, default_spec_file(True)), CPU)
    assert note is None and plan.dtypes == ("fp16",)
    validate(plan, CPU)


@pytest.mark.parametrize("flag", ["ms", "dtypes", "paths", "topk"])
def test_an_empty_list_flag_is_an_error_not_the_default(flag):
    with pytest.raises(UserError, match="is empty"):
        from_options(None, default_spec_file(True), models=("tiny",), **{flag: " , "})


@pytest.mark.parametrize("name", ["../escaped", "a/b", "..", ".hidden", "x" * 101, ""],
                         ids=["parent", "slash", "dotdot", "hidden", "long", "empty-stem"])
def test_a_spec_name_that_is_not_a_plain_file_name_part_is_refused_by_sweep(tmp_path, name):
    """The name ends the run folder's name: ``../`` in it would put the run outside --out. ``moebench sweep``
    refuses it in one line that names the spec file, and writes nothing (an empty name falls back to the
    file's stem, which is plain)."""
    from helpers import moebench_in_process

    spec = _write(tmp_path, f"name: {name!r}\nmodels: [tiny]\nm: [1]\ndtypes: [fp16]\npaths: [torch]\n")
    out = tmp_path / "runs" / "out"
    proc = moebench_in_process("sweep", str(spec), "--out", str(out), "--no-progress")
    if not name:
        assert proc.returncode == 0, proc.stderr  # the precondition: this spec runs as it is
        assert [p.parent.parent for p in out.glob("*/meta.json")] == [out]
        return
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {spec}: sweep name") and "plain file-name part" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # no --out, nothing beside it


def test_the_size_warning_names_each_large_shape_against_the_interpreter_bound():
    from moebench.bench.interpreter import INTERPRETER_MAX_WEIGHTS, interpreter_size_warning, weight_elements
    from moebench.bench.spec import SWEEPS_DIR, load_spec
    from moebench.models import get_model

    quick = load_spec(SWEEPS_DIR / "quick.yaml")
    line = interpreter_size_warning(quick)
    assert line is not None and "\n" not in line
    for name in ("mixtral-8x7b", "deepseek-v3"):
        w = weight_elements(get_model(name))
        assert w > INTERPRETER_MAX_WEIGHTS and f"{w:,}" in line and f"({w / INTERPRETER_MAX_WEIGHTS:.0f}x)" in line
    assert line.startswith(f"warning: {len(quick.points())} point(s)") and f"{INTERPRETER_MAX_WEIGHTS:,}" in line
    assert interpreter_size_warning(load_spec(SWEEPS_DIR / "cpu.yaml")) is None  # the tiny shape runs in seconds


def test_a_sweep_of_a_large_shape_on_the_interpreter_warns_before_it_runs(tmp_path):
    """A shape above the bound (3 * 8 * 512 * 512 = 6.3M weight elements), torch path at M=1: the command warns
    in one line on stderr and still runs."""
    from helpers import moebench_in_process

    from moebench._interpret import interpreting

    if not interpreting():
        pytest.skip("describes a machine without a CUDA GPU")
    spec = tmp_path / "mid.yaml"
    spec.write_text("name: mid\nm: [1]\nshapes: [{name: mid, experts: 8, hidden: 512, intermediate: 512, topk: 2}]\n")
    proc = moebench_in_process("sweep", str(spec), "--dtype", "fp16", "--m", "1", "--path", "torch",
                               "--no-progress", "--out", str(tmp_path / "runs"), "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if line.startswith("warning: 1 point(s)")]
    assert len(warned) == 1 and "mid 6,291,456 (2x)" in warned[0], proc.stderr
