"""moebench.step on the CPU: the config reading (presets, config.json, TP sharding and its refusals), each part
against its float32 reference, and the composition arithmetic."""

from __future__ import annotations

import pytest
import torch

from moebench.errors import UserError
from moebench.models import get_model
from moebench.report import compose
from moebench.step import counts
from moebench.step.config import StepPoint, from_hf, from_hf_fields, get_step
from moebench.step.measure import check_part
from moebench.step.parts import MLP, Attention, Head, MoE, Router

CPU = torch.device("cpu")

# ---- config ------------------------------------------------------------------------------------------------------


def test_deepseek_v3_mla_dense_first_and_shared_expert_at_tp8():
    c = get_step("deepseek-v3", tp=8)
    assert (c.attention, c.heads, c.q_lora_rank, c.kv_lora_rank, c.qk_head_dim, c.v_head_dim) == ("mla", 16, 1536,
                                                                                                  512, 192, 128)
    assert (c.layers, c.dense_layers, c.moe.moe_layers) == (61, 3, 58)
    assert (c.dense_intermediate, c.shared_intermediate, c.moe.intermediate) == (18432 // 8, 2048 // 8, 2048 // 8)
    assert c.vocab == 129280 // 8 and c.kv_cache_width == 576  # the latent: kv_lora_rank + rope, on every GPU


def test_gqa_kv_heads_replicated_below_tp():
    c = get_step("mixtral-8x7b", tp=8)
    assert (c.attention, c.heads, c.kv_heads, c.head_dim, c.vocab) == ("gqa", 4, 1, 128, 4000)
    q = get_step("qwen3-30b-a3b", tp=8)  # 4 KV heads over 8 GPUs: one each, replicated
    assert (q.heads, q.kv_heads) == (4, 1)
    assert get_step("gpt-oss-120b").notes and "full" in get_step("gpt-oss-120b").notes[0]


def test_expert_parallel_splits_whole_experts_over_the_tp_group_through_an_expert_map():
    """DeepSeek-V3 at TP8 with EP8 (vLLM's --enable-expert-parallel): attention and the shared expert as under TP8,
    the MoE layer 32 whole experts of 256 with every token's ids over all 256 (an expert_map), top-k kept."""
    tp, ep = get_step("deepseek-v3", tp=8), get_step("deepseek-v3", tp=8, ep=8)
    assert ep.name == "deepseek-v3@tp8ep8" and (ep.tp, ep.ep) == (8, 8)
    assert (ep.heads, ep.shared_intermediate, ep.vocab) == (tp.heads, tp.shared_intermediate, tp.vocab)
    assert (ep.moe.experts, ep.moe.routed_experts, ep.moe.intermediate, ep.moe.topk) == (32, 256, 2048, 8)
    assert ep.moe.mapped and not tp.moe.mapped and tp.moe.intermediate == 2048 // 8
    with pytest.raises(UserError, match="--ep equals --tp"):
        get_step("deepseek-v3", tp=8, ep=4)


@pytest.mark.parametrize("name, tp, says", [
    ("llama-4-scout", 16, "attention heads (40) is not divisible by --tp 16"),  # 40 heads
    ("qwen3-30b-a3b", 3, "not divisible by --tp 3"),  # heads divide by neither
])
def test_tp_refuses_heads_it_cannot_split(name, tp, says):
    with pytest.raises(UserError, match=says.replace("(", r"\(").replace(")", r"\)")):
        get_step(name, tp)


def _deepseek_dict() -> dict:
    return {"_name_or_path": "org/ds-like", "hidden_size": 7168, "num_hidden_layers": 61, "first_k_dense_replace": 3,
            "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1,
            "intermediate_size": 18432, "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
            "scoring_func": "sigmoid", "n_group": 8}


def test_hf_config_matches_the_preset(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(_deepseek_dict()))
    c, preset = from_hf(tmp_path, tp=8), get_step("deepseek-v3", tp=8)
    fields = ("heads", "kv_lora_rank", "dense_layers", "dense_intermediate", "shared_intermediate", "vocab", "layers")
    assert [getattr(c, f) for f in fields] == [getattr(preset, f) for f in fields]
    assert any("router" in n for n in c.notes)  # sigmoid, grouped top-k: modelled as softmax top-k


def test_hf_config_gqa_defaults_kv_heads_and_head_dim():
    cfg = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000}
    c = from_hf_fields(cfg, get_model("mixtral-8x7b"))
    assert (c.kv_heads, c.head_dim) == (32, 128)  # no num_key_value_heads: MHA; no head_dim: hidden / heads


@pytest.mark.parametrize("drop, says", [
    ("vocab_size", "no vocab_size"),  # the LM head cannot be shaped
    ("qk_rope_head_dim", "no qk_rope_head_dim"),  # MLA without its rope width
    ("intermediate_size", "3 dense layers but no intermediate_size"),  # dense layers without their MLP size
])
def test_hf_config_missing_field_is_one_line(drop, says):
    cfg = _deepseek_dict()
    del cfg[drop]
    moe = get_model("deepseek-v3")
    with pytest.raises(UserError, match=says) as e:
        from_hf_fields(cfg, moe, where="x/config.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("x/config.json")


# ---- parts against their float32 references -----------------------------------------------------------------------

POINTS = [
    StepPoint("prefill", 2, 8),  # two prompts, causal within each
    StepPoint("decode", 3, 16),  # one query a sequence over a cache of 16
]


@pytest.mark.parametrize("model", ["tiny", "tiny-mla"])  # GQA with a dense layer; MLA with a shared expert
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.phase)
def test_parts_match_their_reference(model, dtype, point):
    cfg = get_step(model)
    parts = [Attention(cfg, dtype, CPU, 0), Router(cfg, dtype, CPU, 0), MLP(cfg, dtype, CPU, 0, False),
             Head(cfg, dtype, CPU, 0)]
    if cfg.shared_intermediate:
        parts.append(MLP(cfg, dtype, CPU, 0, True))
    for part in parts:
        p = part.prepare(point)
        chk = check_part(p)
        assert chk.correct, (p.part, chk.rel_err)
        assert p.bytes > 0 and p.flops > 0


def test_mla_decode_absorbed_equals_naive():
    """The absorbed decode is checked against the naive form over the whole cache (not against itself)."""
    p = Attention(get_step("tiny-mla"), "fp32", CPU, 0).prepare(StepPoint("decode", 2, 12))
    assert any("absorbed" in n for n in p.notes)
    chk = check_part(p)
    assert chk.correct and chk.rel_err < 1e-5


@pytest.mark.parametrize("path, dtype", [
    ("torch", "fp16"),  # the reference path: the baseline, not checked
    ("triton", "fp32"),  # moebench's kernel on the interpreter (fp32: its bf16 tl.dot is wrong there)
])
def test_moe_part_through_the_path_registry(path, dtype):
    cfg, point = get_step("tiny"), StepPoint("decode", 2, 4)
    moe = MoE(cfg, dtype, CPU, 0)
    inputs = moe.inputs(point)
    p = moe.prepare(point, path, inputs, moe.reference(inputs))
    if path == "torch":
        assert p.reference is None and not p.graph_safe
        p.run()
        assert torch.isfinite(p.out).all()
    else:
        assert check_part(p).correct and p.graph_safe


def test_head_computes_the_last_token_of_each_prompt_only():
    cfg = get_step("tiny")
    p = Head(cfg, "fp32", CPU, 0).prepare(StepPoint("prefill", 3, 5))
    assert p.out.shape == (3, cfg.vocab)


# ---- composition ----------------------------------------------------------------------------------------------------

def test_counts_follow_the_layers():
    assert counts.part_counts(get_step("deepseek-v3", 8)) == {"attention": 61, "router": 58, "moe": 58, "shared": 58,
                                                          "dense_mlp": 3, "head": 1, "allreduce": 122}
    assert counts.part_counts(get_step("mixtral-8x7b"))["allreduce"] == 0  # no TP, no all-reduce


def test_allreduce_model():
    # 8 GPUs, 1000 tokens x 4096 x 2 bytes = 8.192 MB; a ring moves 2 * 7/8 of it: 14.336 MB at 100 GB/s = 143.36 us
    assert counts.allreduce_us(1000, 4096, 2, 8, 100.0) == pytest.approx(143.36)
    assert counts.allreduce_us(1000, 4096, 2, 8, 100.0, latency_us=5) == pytest.approx(148.36)
    assert counts.allreduce_us(1000, 4096, 2, 1, 100.0, latency_us=5) == 0.0


def _row(part, time_us, count, path=None, measured=True, phase="decode", status="ok"):
    return {"model": "m", "dtype": "bf16", "phase": phase, "batch": 4, "length": 64, "part": part, "path": path,
            "count": count, "time_us": time_us, "measured": measured, "status": status}


def test_compose_sums_counts_times_parts_and_keeps_allreduce_apart():
    rows = [_row("attention", 10.0, 61), _row("router", 1.0, 58), _row("shared", 2.0, 58), _row("dense_mlp", 20.0, 3),
            _row("head", 50.0, 1), _row("allreduce", 3.0, 122, measured=False), _row("moe", 30.0, 58, "triton"),
            _row("moe", 40.0, 58, "cutlass")]
    steps = {s["path"]: s for s in compose.compose(rows, vs="cutlass")}
    common = 61 * 10 + 58 * (1 + 2) + 3 * 20 + 50
    assert steps["triton"]["step_us"] == pytest.approx(common + 58 * 30)
    assert steps["triton"]["allreduce_us"] == pytest.approx(366.0)
    assert steps["triton"]["layer_vs"] == pytest.approx(40 / 30)
    assert steps["triton"]["e2e_vs"] == pytest.approx((common + 58 * 40 + 366) / (common + 58 * 30 + 366))
    rec = {r["path"]: r for r in compose.decode_records(list(steps.values()))}
    assert rec["triton"]["tok_s"] == pytest.approx(4 / ((common + 58 * 30 + 366) * 1e-6))
    assert rec["triton"]["moe_pct"] == pytest.approx(100 * 58 * 30 / (common + 58 * 30))


def test_compose_leaves_a_step_with_a_failed_part_without_a_time():
    rows = [_row("attention", None, 61, status="incorrect"), _row("head", 5.0, 1), _row("moe", 30.0, 58, "triton")]
    (s,) = compose.compose(rows)
    assert s["step_us"] is None and s["missing"] == "attention"
