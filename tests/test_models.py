"""Tests for moebench.models: presets, aliases, config.json reading, TP/EP sharding."""

from __future__ import annotations

import json
from dataclasses import astuple
from pathlib import Path

import pytest

from moebench.errors import UserError
from moebench.models import (
    ALIASES,
    PRESETS,
    MoEShape,
    _config_name,
    from_hf_config,
    get_model,
    model_names,
    shard,
)

HF = Path(__file__).parent / "data" / "hf"

# The published facts, from each model's config.json on Hugging Face:
# name: (experts, hidden, intermediate, topk, moe_layers, shared_experts)
PUBLISHED = {
    "mixtral-8x7b": (8, 4096, 14336, 2, 32, 0),  # 32 layers, all MoE
    "deepseek-v3": (256, 7168, 2048, 8, 58, 1),  # 61 layers, first_k_dense_replace 3
    "qwen3-30b-a3b": (128, 2048, 768, 8, 48, 0),  # 48 layers, decoder_sparse_step 1
    "qwen3-235b-a22b": (128, 4096, 1536, 8, 94, 0),  # 94 layers, decoder_sparse_step 1
    "gpt-oss-120b": (128, 2880, 2880, 4, 36, 0),  # 36 layers, all MoE
    "gpt-oss-20b": (32, 2880, 2880, 4, 24, 0),  # 24 layers, all MoE
    "llama-4-scout": (16, 5120, 8192, 1, 48, 1),  # 48 layers, interleave_moe_layer_step 1
    "kimi-k2": (384, 7168, 2048, 8, 60, 1),  # 61 layers, first_k_dense_replace 1
    "tiny": (8, 128, 64, 2, 2, 0),  # made up, CPU-sized
}


def _fields(shape: MoEShape) -> tuple:
    """Everything but the name: what a config.json reading must reproduce."""
    return astuple(shape)[1:]


def _write(tmp_path: Path, cfg: dict, folder: str = "m") -> Path:
    d = tmp_path / folder
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d / "config.json"


# A minimal Mixtral-spelled MoE config that the layer-pattern tests modify.
BASE = {"hidden_size": 64, "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
        "num_hidden_layers": 8}


# --- presets -----------------------------------------------------------------------------------

def test_presets_carry_the_published_numbers():
    """Every preset exists under its canonical name, validates, and has the published numbers."""
    assert model_names() == list(PUBLISHED)
    for name, facts in PUBLISHED.items():
        shape = PRESETS[name]
        assert shape.name == name
        assert _fields(shape) == facts, name


def test_moe_shape_is_frozen_and_hashable():
    """Shapes are frozen (safe to share as presets) and usable in cache keys."""
    shape = get_model("tiny")
    with pytest.raises(AttributeError):
        shape.experts = 4  # type: ignore[misc]
    assert {shape: 1}[get_model("tiny")] == 1


# --- MoEShape validation -----------------------------------------------------------------------

def test_topk_above_experts_is_refused():
    """A token cannot pick more experts than exist."""
    with pytest.raises(UserError, match=r"topk \(9\) must be <= experts \(8\)"):
        MoEShape("bad", experts=8, hidden=128, intermediate=64, topk=9)


@pytest.mark.parametrize(
    "field, value",
    [
        ("experts", 0),  # no experts at all
        ("hidden", -1),  # negative size
        ("intermediate", 2.5),  # a float where an int is needed
        ("topk", True),  # bool is an int subclass but never a count
        ("moe_layers", 0),  # a model with no MoE layer has nothing to benchmark
        ("shared_experts", -1),  # zero is fine, negative is not
    ],
)
def test_each_field_is_validated_by_name(field, value):
    """A bad field gives a UserError that names the field."""
    args = {"name": "bad", "experts": 8, "hidden": 128, "intermediate": 64, "topk": 2}
    args[field] = value
    with pytest.raises(UserError, match=field):
        MoEShape(**args)


def test_zero_shared_experts_is_valid():
    """shared_experts may be 0 (most models have none)."""
    assert MoEShape("ok", 8, 128, 64, 2, shared_experts=0).shared_experts == 0


# --- get_model ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "typed, canonical",
    [
        ("mixtral", "mixtral-8x7b"),  # short alias
        ("MIXTRAL-8x7B", "mixtral-8x7b"),  # case-insensitive canonical name
        ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),  # HF repo id: org prefix dropped
        ("DeepSeek-V3", "deepseek-v3"),  # case
        ("dsv3", "deepseek-v3"),  # alias
        ("deepseek_v3", "deepseek-v3"),  # model_type spelling, "_" for "-"
        ("qwen3-30b", "qwen3-30b-a3b"),
        ("Qwen/Qwen3-235B-A22B", "qwen3-235b-a22b"),
        ("openai/gpt-oss-20b", "gpt-oss-20b"),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "llama-4-scout"),
        ("kimi-k2-instruct", "kimi-k2"),
        (" Tiny ", "tiny"),  # surrounding blanks
    ],
)
def test_aliases_and_case(typed, canonical):
    """Obvious spellings resolve to the canonical preset."""
    assert get_model(typed) is PRESETS[canonical]


def test_every_alias_points_at_a_preset():
    """The alias table has no dangling targets."""
    assert set(ALIASES.values()) <= set(PRESETS)


def test_unknown_model_lists_the_known_names():
    """The error for an unknown name is one line that lists every preset."""
    with pytest.raises(UserError) as err:
        get_model("gpt-5")
    msg = str(err.value)
    assert "'gpt-5'" in msg and "\n" not in msg
    for name in PRESETS:
        assert name in msg


# --- from_hf_config ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "family, preset",
    [
        ("mixtral", "mixtral-8x7b"),  # num_local_experts + intermediate_size
        ("deepseek-v3", "deepseek-v3"),  # n_routed_experts + moe_intermediate_size, 3 dense layers
        ("kimi-k2", "kimi-k2"),  # DeepSeek-V3 fields, 1 dense layer
        ("qwen3-moe", "qwen3-30b-a3b"),  # num_experts, intermediate_size (dense) must be ignored
        ("gpt-oss", "gpt-oss-120b"),  # experts_per_token spelling
        ("llama-4", "llama-4-scout"),  # fields under text_config; vision_config must not leak in
    ],
)
def test_real_configs_match_the_presets(family, preset):
    """The sample config.json of a real model reads back as its preset (all fields but the name)."""
    assert _fields(from_hf_config(HF / family / "config.json")) == _fields(PRESETS[preset])


def test_qwen2_moe_shared_expert():
    """Qwen1.5-MoE-A2.7B (qwen2_moe): shared_expert_intermediate_size means one shared expert."""
    shape = from_hf_config(HF / "qwen2-moe")
    assert _fields(shape) == (60, 2048, 1408, 4, 24, 1)


def test_directory_or_file_and_the_name():
    """A directory holding config.json works; the name is _name_or_path's basename, else the folder."""
    assert from_hf_config(HF / "mixtral").name == "mixtral-8x7b-v0.1"  # from _name_or_path
    assert from_hf_config(HF / "deepseek-v3" / "config.json").name == "deepseek-v3"  # folder name
    assert from_hf_config(str(HF / "llama-4")).name == "llama-4"  # a str path too


def test_name_from_hf_cache_snapshot(tmp_path):
    """In the HF cache the folder is a commit hash; the repo name is taken from models--Org--Name."""
    snap = tmp_path / "models--Qwen--Qwen3-30B-A3B" / "snapshots" / "0123abcd"
    cfg = json.loads((HF / "qwen3-moe" / "config.json").read_text())
    _write(snap.parent, cfg, snap.name)
    assert from_hf_config(snap).name == "qwen3-30b-a3b"


def test_name_falls_back_to_model_type():
    """With no _name_or_path and no folder name (a file at the root), model_type names the shape."""
    assert _config_name({"model_type": "Qwen3_MoE"}, Path("/config.json")) == "qwen3_moe"


def test_gpt_oss_experts_per_token_alone(tmp_path):
    """gpt-oss's own spelling experts_per_token is enough when num_experts_per_tok is absent."""
    cfg = json.loads((HF / "gpt-oss" / "config.json").read_text())
    del cfg["num_experts_per_tok"]
    assert from_hf_config(_write(tmp_path, cfg)).topk == 4


@pytest.mark.parametrize(
    "extra, moe_layers",
    [
        ({}, 8),  # no pattern fields: every layer is MoE (Mixtral, gpt-oss)
        ({"first_k_dense_replace": 2}, 6),  # DeepSeek: layers 0-1 dense
        ({"first_k_dense_replace": 1, "moe_layer_freq": 2}, 3),  # DeepSeek: i >= 1 and i % 2 == 0 -> 2,4,6
        ({"decoder_sparse_step": 2}, 4),  # Qwen: (i + 1) % 2 == 0 -> 1,3,5,7
        ({"mlp_only_layers": [0, 5]}, 6),  # Qwen: listed layers are dense
        ({"decoder_sparse_step": 2, "mlp_only_layers": [1, 2]}, 3),  # Qwen: both rules -> 3,5,7
        ({"interleave_moe_layer_step": 2}, 4),  # Llama-4 Maverick style: layers // step
        ({"interleave_moe_layer_step": 3}, 2),  # 8 // 3: layers 2 and 5
        ({"moe_layers": [1, 3, 99]}, 2),  # Llama-4 explicit list wins; out-of-range index ignored
    ],
)
def test_moe_layer_count_by_family_rules(tmp_path, extra, moe_layers):
    """MoE layers = layers minus dense ones, by each family's layer-pattern fields."""
    assert from_hf_config(_write(tmp_path, {**BASE, **extra})).moe_layers == moe_layers


def test_llama4_maverick_interleaving(tmp_path):
    """Llama-4 Maverick's 48 layers with interleave_moe_layer_step 2 give 24 MoE layers, 1 shared expert."""
    cfg = json.loads((HF / "llama-4" / "config.json").read_text())
    cfg["text_config"].update(num_local_experts=128, interleave_moe_layer_step=2)
    shape = from_hf_config(_write(tmp_path, cfg))
    assert (shape.experts, shape.moe_layers, shape.shared_experts) == (128, 24, 1)


def test_missing_file(tmp_path):
    """A path with no config.json names the file it looked for."""
    with pytest.raises(UserError, match=r"config\.json: no such file"):
        from_hf_config(tmp_path)
    with pytest.raises(UserError, match="nope.json: no such file"):
        from_hf_config(tmp_path / "nope.json")


@pytest.mark.parametrize(
    "content, why",
    [
        ("{ not json", "not JSON"),  # syntax error
        ("\xff\xfe\x00garbage".encode("latin-1"), "not UTF-8 text"),  # not text at all
        ("[1, 2]", "expected a JSON object"),  # valid JSON, wrong shape
    ],
)
def test_bad_json(tmp_path, content, why):
    """Unreadable JSON gives one line naming the file."""
    f = tmp_path / "config.json"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UserError) as err:
        from_hf_config(f)
    assert why in str(err.value) and str(f) in str(err.value) and "\n" not in str(err.value)


def test_dense_config_is_not_moe():
    """A dense model (Llama-3 8B) is refused, and the message says which fields were looked for."""
    with pytest.raises(UserError) as err:
        from_hf_config(HF / "dense-llama")
    msg = str(err.value)
    assert "not a MoE config" in msg and "dense-llama" in msg
    for field in ("num_local_experts", "n_routed_experts", "num_experts", "num_experts_per_tok"):
        assert field in msg


def test_zero_experts_is_not_moe(tmp_path):
    """num_experts: 0 (a dense variant of a MoE family) is treated as not MoE."""
    with pytest.raises(UserError, match="not a MoE config"):
        from_hf_config(_write(tmp_path, {**BASE, "num_local_experts": 0}))


@pytest.mark.parametrize(
    "change, match",
    [
        ({"hidden_size": None}, "without hidden_size"),  # required field missing
        ({"intermediate_size": None}, "without moe_intermediate_size or intermediate_size"),
        ({"num_hidden_layers": "32"}, "num_hidden_layers must be a non-negative integer"),  # wrong type
        ({"num_experts_per_tok": 5}, r"topk \(5\) must be <= experts \(4\)"),  # shape check, file named
        ({"first_k_dense_replace": 8}, "no MoE layer"),  # every layer dense
    ],
)
def test_malformed_moe_config(tmp_path, change, match):
    """A MoE config with a missing or impossible field gives a UserError naming file and field."""
    cfg = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    f = _write(tmp_path, cfg)
    with pytest.raises(UserError, match=match) as err:
        from_hf_config(f)
    assert str(f) in str(err.value)


# --- shard -------------------------------------------------------------------------------------

def test_shard_deepseek_tp8():
    """vLLM --tp 8 splits DeepSeek-V3's expert intermediate 2048 into 256 per GPU, all 256 experts kept."""
    s = shard(get_model("deepseek-v3"), tp=8)
    assert s.name == "deepseek-v3@tp8"
    assert (s.experts, s.hidden, s.intermediate, s.topk) == (256, 7168, 256, 8)
    assert (s.moe_layers, s.shared_experts) == (58, 1)  # model-level facts are kept


def test_shard_ep_and_both():
    """--ep N keeps whole experts, E/N of them; tp and ep combine, and the name says both."""
    s = shard(get_model("qwen3-235b-a22b"), ep=4)
    assert (s.name, s.experts, s.intermediate, s.topk) == ("qwen3-235b-a22b@ep4", 32, 1536, 8)
    s = shard(get_model("deepseek-v3"), tp=2, ep=4)
    assert (s.name, s.experts, s.intermediate) == ("deepseek-v3@tp2ep4", 64, 1024)


def test_shard_caps_topk_at_local_experts():
    """Mixtral over 8 GPUs by EP holds one expert each: topk 2 is capped at 1 local expert."""
    s = shard(get_model("mixtral-8x7b"), ep=8)
    assert (s.experts, s.topk) == (1, 1)


def test_shard_identity():
    """tp = ep = 1 returns the shape unchanged (same object, no suffix)."""
    shape = get_model("kimi-k2")
    assert shard(shape) is shape


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tp": 3}, r"intermediate size 2048 is not divisible by --tp 3"),
        ({"ep": 7}, r"256 experts are not divisible by --ep 7"),
        ({"tp": 0}, r"--tp must be a positive integer, got 0"),
        ({"ep": -2}, r"--ep must be a positive integer, got -2"),
    ],
)
def test_shard_errors_name_the_numbers(kwargs, match):
    """Non-divisible or non-positive degrees are UserErrors quoting the numbers."""
    with pytest.raises(UserError, match=match):
        shard(get_model("deepseek-v3"), **kwargs)
