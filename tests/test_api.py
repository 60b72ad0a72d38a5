"""The library entry point ``moebench.fused_moe``: the README's example, the float32 reference in fp16 and fp32,
the tile config it looks up (--configs folder, MOEBENCH_CONFIGS, heuristic) or is given, and one-line errors.

On the CPU the kernels run on the Triton interpreter, in fp16 and fp32 (its bf16 dot is wrong).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import moebench
from moebench.dtypes import DTYPES
from moebench.environment import device_name
from moebench.errors import UserError
from moebench.models import MoEShape
from moebench.paths.registry import get_path
from moebench.paths.torch_ref import moe_reference
from moebench.problem import Problem, Weights, make_inputs
from moebench.serve import api
from moebench.tables import lookup
from moebench.tables.formats.moebench import TableMeta, file_name, table_text
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig, default_config

ROOT = Path(__file__).resolve().parent.parent
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
E, H, I, TOPK = 8, 128, 64, 2
AT_4 = TileConfig(16, 32, 32, 1, 2, 2)  # the table's configs: neither is the heuristic at its M
AT_64 = TileConfig(32, 32, 64, 1, 4, 2)
VLLM_DICT = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 2}


@pytest.fixture(autouse=True)
def no_env_or_shipped(monkeypatch, tmp_path):
    """No table but the ones a test writes: MOEBENCH_CONFIGS unset, the shipped folder empty."""
    monkeypatch.delenv(lookup.ENV_VAR, raising=False)
    monkeypatch.setattr(lookup, "SHIPPED_DIR", tmp_path / "shipped")


def layer(M: int, dtype: torch.dtype, seed: int = 0, e: int = E, h: int = H, i: int = I):
    """x [M, h], w13 [e, 2i, h], w2 [e, h, i] in ``dtype``; routing [M, TOPK] as a router gives it (float32
    weights, int64 ids)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, h, generator=gen).to(DEVICE, dtype)
    w13 = (torch.randn(e, 2 * i, h, generator=gen) / h**0.5).to(DEVICE, dtype)
    w2 = (torch.randn(e, h, i, generator=gen) / i**0.5).to(DEVICE, dtype)
    topk_weights, topk_ids = torch.rand(M, e, generator=gen).softmax(-1).topk(TOPK)
    return x, w13, w2, topk_weights.to(DEVICE), topk_ids.to(DEVICE)


def rel_err(out, x, w13, w2, topk_weights, topk_ids, expert_map=None) -> float:
    """||out - ref|| / ||ref||, ref the project's float32 reference of the layer."""
    ref = moe_reference(x, Weights(w13, w2, None, None, None), topk_weights.float(), topk_ids, expert_map=expert_map)
    return float(torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref))


def spy(monkeypatch) -> list[TileConfig]:
    """The tile config of every launch fused_moe makes, recorded while it still launches."""
    seen = []

    def launch(*args, **kwargs):
        seen.append(args[5])
        return real(*args, **kwargs)

    real = api.launch
    monkeypatch.setattr(api, "launch", launch)
    return seen


def write_tables(folder: Path, dtype: str = "fp16") -> None:
    """A moebench table for (E, I) on this machine's device, keys 4 and 64."""
    meta = TableMeta(device_name=device_name(), dtype=dtype,
                     shape={"experts": E, "intermediate": I, "hidden": H, "topk": TOPK})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / file_name(E, I, device_name(), dtype)).write_text(table_text(meta, ConfigTable({4: AT_4, 64: AT_64})))


@pytest.mark.skipif(DEVICE == "cuda", reason="the example's tensors are on the CPU: a GPU machine runs them only "
                    "with TRITON_INTERPRET=1, which the test removes")
@pytest.mark.parametrize("marker", ["fused_moe example", "fused_moe EP example"])
def test_the_readme_example_runs_as_a_users_script_and_matches_the_reference(tmp_path, marker):
    """The README's examples (the layer; one rank of it under expert parallelism, with an expert_map), each copied
    into a file and run by a fresh interpreter with TRITON_INTERPRET unset, as a user runs it: moebench, not the
    test set-up, turns on the interpreter before Triton is imported."""
    text = (ROOT / "README.md").read_text()
    found = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```\s*<!-- /{marker} -->", text, re.S)
    assert found, f"README.md has no {marker} between its markers"
    script, saved = tmp_path / "example.py", tmp_path / "tensors.pt"
    script.write_text(found.group(1) + f"\ntorch.save(dict(out=out, x=x, w13=w13, w2=w2, topk_weights=topk_weights, "
                      f"topk_ids=topk_ids, expert_map=globals().get('expert_map')), {str(saved)!r})\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = torch.load(saved)
    out, x, w13, w2, expert_map = t["out"], t["x"].half(), t["w13"].half(), t["w2"].half(), t["expert_map"]
    assert out.shape == x.shape and out.dtype == torch.float16
    if expert_map is not None:  # the example reaches both kinds of slot: local experts and other ranks'
        mapped = expert_map[t["topk_ids"]]
        assert (mapped >= 0).any() and (mapped < 0).any() and w13.shape[0] < expert_map.numel()
    assert rel_err(out, x, w13, w2, t["topk_weights"], t["topk_ids"], expert_map) < DTYPES["fp16"].rtol


@pytest.mark.parametrize("dtype, M", [
    (torch.float16, 3),  # 6 slots for 8 experts: experts with no tokens
    (torch.float32, 33),  # M no power of two, about 8 slots per expert
])
def test_fused_moe_matches_the_reference_with_a_routers_dtypes(dtype, M):
    """int64 ids and float16 weights, as routers give them, are converted; the output is x's dtype."""
    x, w13, w2, topk_weights, topk_ids = layer(M, dtype, seed=M)
    weights16 = topk_weights.half()
    assert topk_ids.dtype == torch.int64
    out = moebench.fused_moe(x, w13, w2, weights16, topk_ids)
    assert out.dtype == dtype and out.shape == (M, H)
    assert rel_err(out, x, w13, w2, weights16, topk_ids) < DTYPES["fp16" if dtype == torch.float16 else "fp32"].rtol


@pytest.mark.parametrize("M, key", [(5, 4), (50, 64)])
def test_a_table_in_configs_dir_is_used_at_the_nearest_m(tmp_path, monkeypatch, M, key):
    """config_for reads the table at the key nearest M, and fused_moe runs that config, still correct."""
    write_tables(tmp_path / "mine")
    x, w13, w2, topk_weights, topk_ids = layer(M, torch.float16, seed=M)
    heuristic = default_config(M, E, TOPK, 2, None)
    assert heuristic not in (AT_4, AT_64)  # so the table's config is told apart from the fallback
    chosen = moebench.config_for(x, w13, w2, topk_ids, configs_dir=tmp_path / "mine")
    assert (chosen.source, chosen.table_m, chosen.config) == ("configs", key, {4: AT_4, 64: AT_64}[key])
    seen = spy(monkeypatch)
    out = moebench.fused_moe(x, w13, w2, topk_weights, topk_ids, configs_dir=tmp_path / "mine")
    assert seen == [chosen.config]
    assert rel_err(out, x, w13, w2, topk_weights, topk_ids) < DTYPES["fp16"].rtol


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_heuristic_is_the_triton_paths_default(dtype):
    """Without a table a call runs what the benchmark's triton path runs untuned (fp8-block128: K = 128)."""
    spec = DTYPES[dtype]
    for M in (1, 64, 4096):
        problem = Problem(MoEShape("test", E, H, I, TOPK), M, dtype)
        assert default_config(M, E, TOPK, spec.weight_bytes, spec.fp8_scheme) == \
            get_path("triton").default_config(problem)


def test_the_env_folder_is_used_without_configs_dir_and_else_the_heuristic(tmp_path, monkeypatch):
    x, w13, w2, _, topk_ids = layer(4, torch.float16)
    heuristic = default_config(4, E, TOPK, 2, None)
    assert moebench.config_for(x, w13, w2, topk_ids) == lookup.Chosen(heuristic, "heuristic")
    write_tables(tmp_path / "env")
    monkeypatch.setenv(lookup.ENV_VAR, str(tmp_path / "env"))
    chosen = moebench.config_for(x, w13, w2, topk_ids)
    assert (chosen.source, chosen.table_m, chosen.config) == ("env", 4, AT_4)
    fp32 = [t.float() for t in (x, w13, w2)]  # a table of another dtype is not read
    assert moebench.config_for(*fp32, topk_ids).source == "heuristic"


def test_fp8_weights_with_static_scales_read_their_own_table_and_match_the_reference(tmp_path, monkeypatch):
    """Static activation scales make the dtype fp8-tensor-static: its table is read, not the dynamic one's (a
    dynamic layer of the shape has no table: its config is fitted from the static one's, of the same fp8 class)."""
    problem = Problem(MoEShape("test", E, H, I, TOPK), 4, "fp8-tensor-static", seed=2)
    inp = make_inputs(problem, DEVICE, draw=1)
    w = inp.weights
    mine = tmp_path / "mine"
    write_tables(mine, "fp8-tensor-static")
    dynamic = moebench.config_for(inp.x, w.w13, w.w2, inp.topk_ids, fp8_scheme="tensor", configs_dir=mine)
    assert dynamic.source == "fitted" and dynamic.table.name == file_name(E, I, device_name(), "fp8-tensor-static")
    scales = dict(fp8_scheme="tensor", w13_scale=w.w13_scale, w2_scale=w.w2_scale, act_scale=w.act_scale)
    seen = spy(monkeypatch)
    out = moebench.fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, **scales, configs_dir=mine)
    assert seen == [AT_4]
    ref = moe_reference(inp.x, w, inp.topk_weights, inp.topk_ids)
    assert torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref) < problem.spec.rtol
    with pytest.raises(UserError, match=r"needs w2_scale \[8\]"):
        moebench.fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, **{**scales, "w2_scale": None})


def test_a_dict_of_vllms_six_keys_is_run_as_that_config(monkeypatch):
    x, w13, w2, topk_weights, topk_ids = layer(9, torch.float32, seed=9)
    seen = spy(monkeypatch)
    out = moebench.fused_moe(x, w13, w2, topk_weights, topk_ids, config=VLLM_DICT)
    assert seen == [TileConfig(**VLLM_DICT)]
    assert rel_err(out, x, w13, w2, topk_weights, topk_ids) < DTYPES["fp32"].rtol
    with pytest.raises(UserError, match="unknown key 'BLOCK_M'"):
        moebench.fused_moe(x, w13, w2, topk_weights, topk_ids, config={**VLLM_DICT, "BLOCK_M": 16})


def _mismatch(case: str) -> tuple:
    x, w13, w2, tw, ti = layer(3, torch.float32)
    return {
        "experts": (x, w13, w2[:-1], tw, ti),  # w2 has one expert fewer than w13
        "intermediate": (x, w13, w2[..., :-16], tw, ti),  # w2's I is not half w13's 2I
        "hidden": (x[:, :-1], w13, w2, tw, ti),  # x narrower than the weights' hidden
        "topk_weights": (x, w13, w2, tw[:, :1], ti),  # weights and ids of different top-k
        "tokens": (x[:2], w13, w2, tw, ti),  # routing for more tokens than x holds
        "weight dtype": (x, w13.half(), w2.half(), tw, ti),  # fp16 weights for fp32 x
        "device": (x, w13, w2.to("meta"), tw, ti),  # a tensor on another device
    }[case]


@pytest.mark.parametrize("case, message", [
    ("experts", "disagree on E or I"), ("intermediate", "disagree on E or I"), ("hidden", "disagree on hidden"),
    ("topk_weights", "shaped as topk_ids"), ("tokens", "a row per token"), ("weight dtype", "weights must be"),
    ("device", "on one device"),
])
def test_mismatched_tensors_are_one_line(case, message):
    with pytest.raises(UserError, match=message) as e:
        moebench.fused_moe(*_mismatch(case))
    assert "\n" not in str(e.value)


def test_the_entry_points_load_on_first_use():
    """`import moebench` loads neither moebench.serve.api nor torch; `moebench.fused_moe` loads both."""
    code = ("import sys, moebench\n"
            "assert 'moebench.serve.api' not in sys.modules and 'torch' not in sys.modules\n"
            "from moebench import config_for\n"
            "assert moebench.fused_moe is sys.modules['moebench.serve.api'].fused_moe and 'torch' in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert moebench.config_for is api.config_for and "fused_moe" in dir(moebench)
    with pytest.raises(AttributeError, match="nonexistent"):
        moebench.nonexistent  # noqa: B018
