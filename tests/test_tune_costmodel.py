"""The cost model's shape: more tokens cost more, fp8 makes the layer faster, and its ranking keeps ties in the
order given (so a search's seeds do not depend on how the model breaks them). Two properties it does not have
(more tokens never cost less at decode; fp8 never costs more than bf16 for one config) are in docs/tuning.md."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from moebench.hardware import HOPPER
from moebench.models import get_model, shard
from moebench.problem import Problem
from moebench.space.declared import get_space
from moebench.space.prune import Facts, prune
from moebench.tune.costmodel import estimate_us, rank

SHAPES = {
    "qwen3-30b-a3b": lambda: get_model("qwen3-30b-a3b"),  # 128 experts, top 8
    "deepseek-v3@tp8": lambda: shard(get_model("deepseek-v3"), tp=8),  # 256 experts, a narrow intermediate
    "mixtral-8x7b": lambda: get_model("mixtral-8x7b"),  # 8 experts, top 2: wide experts, each sees many tokens
}
CONFIGS = list(get_space("triton-classic").engine_configs())


def facts(shape: str, M: int, dtype: str) -> Facts:
    return Facts.of(Problem(SHAPES[shape](), M, dtype), "triton-classic", HOPPER)


def falls(shape: str, dtype: str, ms: tuple[int, ...]) -> list[str]:
    """The configs whose estimate falls from one M of ``ms`` to the next."""
    fs = [facts(shape, M, dtype) for M in ms]
    bad = []
    for cfg in CONFIGS:
        est = [estimate_us(cfg, f) for f in fs]
        if any(b < a for a, b in zip(est, est[1:])):
            bad.append(f"{shape} {dtype} {cfg.label}: {[round(e, 1) for e in est]}")
    return bad


@pytest.mark.parametrize("dtype", ["bf16", "fp8-block128"])
@pytest.mark.parametrize("shape", SHAPES)
def test_prefill_costs_more_than_decode_for_every_config(shape, dtype):
    decode, prefill = facts(shape, 1, dtype), facts(shape, 4096, dtype)
    bad = [c.label for c in CONFIGS if estimate_us(c, prefill) <= estimate_us(c, decode)]
    assert not bad, f"{len(bad)} configs, e.g. {bad[:3]}"


@pytest.mark.parametrize("dtype", ["bf16", "fp8-block128"])
@pytest.mark.parametrize("shape", ["qwen3-30b-a3b", "deepseek-v3@tp8"])
def test_from_16_tokens_up_the_recorded_token_counts_never_cost_less(shape, dtype):
    bad = falls(shape, dtype, (16, 256, 4096))
    assert not bad, f"{len(bad)} configs, e.g. {bad[:3]}"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("M", [1, 16, 256, 4096])
def test_fp8_makes_the_best_and_the_typical_config_faster(shape, M):
    bf16, fp8 = facts(shape, M, "bf16"), facts(shape, M, "fp8-block128")
    assert fp8.operand_bytes * 2 == bf16.operand_bytes
    kept = prune(CONFIGS, bf16)[0]  # the same configs at both, so only the bytes differ
    ratios = sorted(estimate_us(c, fp8) / estimate_us(c, bf16) for c in kept)
    assert min(estimate_us(c, fp8) for c in kept) < min(estimate_us(c, bf16) for c in kept)
    assert ratios[len(ratios) // 2] < 1, f"the median config's fp8/bf16 estimate is {ratios[len(ratios) // 2]:.3f}"


def test_rank_sorts_by_estimate_and_keeps_ties_in_the_given_order():
    f = facts("qwen3-30b-a3b", 256, "bf16")
    # GROUP_SIZE_M 16, 32 and 64 are one estimate (the model reads only whether rows are grouped): ties.
    bases = CONFIGS[::97]
    configs = [replace(b, GROUP_SIZE_M=g) for b in bases for g in (16, 32, 64, 1)]
    random.Random(0).shuffle(configs)
    est = {c.key(): estimate_us(c, f) for c in configs}
    ties = [c for c in configs if sum(est[d.key()] == est[c.key()] for d in configs) > 1]
    assert len(ties) >= len(bases) * 3  # the case has ties to keep in order
    ranked = rank(configs, f)
    assert sorted(c.key() for c in ranked) == sorted(c.key() for c in configs)
    assert all(est[a.key()] <= est[b.key()] for a, b in zip(ranked, ranked[1:]))
    for e in {est[c.key()] for c in ties}:
        assert [c for c in ranked if est[c.key()] == e] == [c for c in configs if est[c.key()] == e]
