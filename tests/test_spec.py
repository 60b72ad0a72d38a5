"""Sweep specs: strict YAML, flags, and the plan they expand to."""

from __future__ import annotations

import pytest

from moebench.errors import UserError
from moebench.spec import build_spec, load_spec

REPO_SWEEPS = __import__("pathlib").Path(__file__).resolve().parent.parent / "sweeps"


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
    ("models: [tiny]\nm: [0]\n", "M must be positive"),  # impossible M
    ("models: [tiny]\nm: [1]\ntopk: 9\n", "top-k 9 impossible"),  # top-k > experts
    ("models: [tiny]\nm: [1]\ndtypes: [int4]\n", "unknown dtype"),  # unknown dtype
    ("models: [tiny]\nm: [1]\npaths: [magic]\n", "unknown path"),  # unknown path
    ("shapes: [{experts: 8, hidden: 64}]\nm: [1]\n", "missing 'intermediate'"),  # incomplete shape
    ("models: [tiny]\nm: [two]\n", "not an integer"),  # non-numeric M
])
def test_bad_specs_fail_with_one_line(tmp_path, text, fragment):
    with pytest.raises(UserError) as info:
        load_spec(_write(tmp_path, text))
    msg = str(info.value)
    assert fragment in msg and "\n" not in msg and "spec.yaml" in msg


def test_missing_spec_file(tmp_path):
    with pytest.raises(UserError, match="no sweep spec"):
        load_spec(tmp_path / "nope.yaml")


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
    from moebench.spec import from_options

    plan = from_options(None, REPO_SWEEPS / "cpu.yaml", experts=8, hidden=64, intermediate=32, topk="2,4",
                        ms="1,3", paths="torch")
    assert sorted(s.topk for s in plan.shapes) == [2, 4] and plan.ms == (1, 3) and plan.paths == ("torch",)
    over = from_options(REPO_SWEEPS / "quick.yaml", REPO_SWEEPS / "cpu.yaml", ms="7", dtypes="fp16", tune=True)
    assert over.ms == (7,) and over.dtypes == ("fp16",) and over.tune
    assert {s.name for s in over.shapes} == {"mixtral-8x7b", "deepseek-v3"}
    with pytest.raises(UserError, match="not both"):
        from_options(REPO_SWEEPS / "quick.yaml", REPO_SWEEPS / "cpu.yaml", models=("tiny",))
