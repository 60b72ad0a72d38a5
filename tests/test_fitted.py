"""The fitted default (``moebench.tables.fitted``) on the shipped H200 tables: deterministic, never from a held-out
shape, every config it gives runnable on its target (pruning rules, ``TileConfig``, the launch plan) across the
served entries at vLLM's 18 token counts; and the rules that carry a tuned config to another shape."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from moebench.dtypes import DTYPES
from moebench.hardware import HOPPER
from moebench.kernels.fused_moe import DeviceFacts, LayerShapes, launch_plan
from moebench.space.declared import VLLM_MS
from moebench.space.prune import OWN_RULES, RULES, Facts
from moebench.tables import lookup
from moebench.tables.fitted import CLASS_OF, SATURATED_SLOTS, Fit, Tuned, Where, fit_to, gemm2_smem_bytes
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig
from moebench.tune.served import SERVED

SHIPPED = [Tuned.of_file(p) for p in sorted(lookup.SHIPPED_DIR.glob("moebench-tiles_*.json"))]
FIT = Fit(SHIPPED)
EVERYWHERE = Fit(SHIPPED, max_distance=math.inf)  # a config at every point: fit_to runs on every served shape
# Runnable: what the kernel refuses, what cannot compile, and the rules the fit applies. same-order only says
# which of equal program orders the search keeps.
CHECKED = [r for r in (*RULES, *OWN_RULES) if r.name != "same-order"]


def where_of(entry, M: int) -> Where:
    s = entry.shape
    return Where(M, s.experts, s.topk, s.hidden, s.intermediate)


def assert_runnable(cfg: TileConfig, w: Where, dtype: str) -> None:
    spec = DTYPES[dtype]
    facts = Facts("triton", w.M, w.experts, w.topk, w.hidden, w.intermediate, spec.weight_bytes,
                  spec.fp8_scheme == "block128", HOPPER.smem_bytes, HOPPER.sms)
    assert [r.name for r in CHECKED if r.drops(cfg, facts)] == [], (cfg.label, w, dtype)
    assert TileConfig(**cfg.as_dict()) == cfg
    launch_plan(cfg, spec.fp8_scheme, LayerShapes(w.M, w.experts, w.hidden, w.intermediate, w.topk,
                                                  static_scales=spec.static_act, weight_bytes=spec.weight_bytes),
                DeviceFacts(pdl=True, interpreting=False))  # the GPU's plan: a UserError where it cannot run


def test_the_shipped_tables_are_what_the_fit_reads():
    """Precondition of the tests below: the shipped tables load, each with one shape and a dtype class."""
    assert SHIPPED and all(t is not None and t.dtype in CLASS_OF for t in SHIPPED)


@pytest.mark.parametrize("entry", SERVED, ids=lambda e: e.name)
def test_every_fitted_config_is_runnable_on_its_target(entry):
    """At each of vLLM's M, what the fit gives (near enough or not) runs on the entry's shape and dtype."""
    for M in VLLM_MS:
        w = where_of(entry, M)
        far = EVERYWHERE.predict(w, entry.dtype, HOPPER)
        assert far is not None  # every entry has a class with tables: the point reaches fit_to
        assert_runnable(far.config, w, entry.dtype)
        near = FIT.predict(w, entry.dtype, HOPPER)
        if near is not None:
            assert near.distance <= FIT.max_distance
            assert_runnable(near.config, w, entry.dtype)


@pytest.mark.parametrize("dtype", ["bf16", "fp8-channel", "fp8-block128"])  # one of each class
def test_every_tuned_config_carried_to_every_served_shape_is_runnable_or_refused(dtype):
    """fit_to on each shipped config, onto each served shape at decode, mid and prefill: runnable, or None."""
    for t in SHIPPED:
        for key, cfg in t.table.items():
            for entry in SERVED:
                for M in (1, 64, 4096):
                    w = where_of(entry, M)
                    out = fit_to(cfg, t.at(key), w, dtype, HOPPER)
                    if out is not None:
                        assert_runnable(out, w, dtype)


def test_the_fit_is_deterministic_whatever_the_order_of_its_tables():
    backwards = Fit(list(reversed(SHIPPED)))
    for entry in SERVED:
        for M in VLLM_MS:
            w = where_of(entry, M)
            a, b = FIT.predict(w, entry.dtype, HOPPER), backwards.predict(w, entry.dtype, HOPPER)
            assert (a is None) == (b is None)
            if a is not None:
                assert (a.config, a.table.name, a.table_m) == (b.config, b.table.name, b.table_m)


@pytest.mark.parametrize("held", SHIPPED, ids=lambda t: t.name)
def test_holding_a_shape_out_never_predicts_from_it(held):
    own = EVERYWHERE.predict(held.at(min(held.table)), held.dtype, HOPPER)
    assert own.table.shape == held.shape and own.distance == 0  # unheld, a shape's own table is nearest
    without = EVERYWHERE.without(held.shape)
    for M in VLLM_MS:
        got = without.predict(held.at(M), held.dtype, HOPPER)
        assert got is None or got.table.shape != held.shape


def test_a_class_fits_from_its_own_tables_and_borrows_only_where_it_has_none():
    """fp8 per tensor fits from its own class, and from 16-bit tables where it has none; fp8-block128 and fp32
    borrow from none."""
    block = [t for t in SHIPPED if t.dtype == "fp8-block128"]
    sixteen = [t for t in SHIPPED if CLASS_OF[t.dtype] == "16-bit"]
    fp8 = [t for t in SHIPPED if CLASS_OF[t.dtype] == "fp8"]
    assert block and sixteen and fp8
    fit = Fit(SHIPPED, max_distance=math.inf)
    w = Where(16, 64, 6, 4096, 1024)
    assert fit.predict(w, "fp8-block128", HOPPER).table.dtype == "fp8-block128"
    assert CLASS_OF[fit.predict(w, "fp8-tensor", HOPPER).table.dtype] == "fp8"
    without_fp8 = Fit(block + sixteen, max_distance=math.inf)
    assert CLASS_OF[without_fp8.predict(w, "fp8-tensor", HOPPER).table.dtype] == "16-bit"
    assert fit.predict(w, "fp32", HOPPER) is None
    assert Fit(block, max_distance=math.inf).predict(w, "bf16", HOPPER) is None


def test_a_point_too_far_gives_nothing():
    t = SHIPPED[0]
    far = Where(1, 8, 1, t.hidden * 64, t.intermediate * 64)  # K and N 64x apart, few experts
    assert Fit([t]).predict(far, t.dtype, HOPPER) is None
    assert Fit([t], max_distance=math.inf).predict(far, t.dtype, HOPPER) is not None


# ---- carrying one config to another shape -------------------------------------------------------------

BASE = TileConfig(16, 64, 128, 1, 4, 3)
AT = Where(4, 128, 8, 2048, 768)  # where BASE was tuned: 32 slots over 128 experts


def test_fp8_block128_steps_k_by_one_scale_block():
    out = fit_to(replace(BASE, BLOCK_SIZE_K=64), AT, AT, "fp8-block128", HOPPER)
    assert out.BLOCK_SIZE_K == 128


def test_a_tile_per_slot_is_dropped_where_slots_outnumber_experts_twice():
    direct = replace(BASE, direct_route=True, gemm2_preload=True, gemm1_quant_x=True)
    few = fit_to(direct, AT, AT, "fp8-block128", HOPPER)
    assert few.direct_route and few.gemm1_quant_x and few.gemm2_preload
    many = replace(AT, M=64)  # 512 slots over 128 experts
    assert many.slots > 2 * many.experts
    out = fit_to(direct, AT, many, "fp8-block128", HOPPER)
    assert not (out.direct_route or out.gemm1_quant_x or out.gemm2_preload)
    assert not fit_to(direct, AT, AT, "bf16", HOPPER).gemm1_quant_x  # x quantized in GEMM1: fp8-block128 only


def test_tma_is_dropped_where_rows_are_not_a_multiple_of_16_bytes():
    tma = replace(BASE, gemm1_tma=True)
    assert fit_to(tma, AT, AT, "bf16", HOPPER).gemm1_tma
    assert not fit_to(tma, AT, replace(AT, hidden=2044), "bf16", HOPPER).gemm1_tma  # 4088 bytes a row


def test_a_split_keeps_the_k_steps_of_a_program_where_the_grid_is_small():
    split = replace(BASE, split_k=2)
    longer = replace(AT, M=1, hidden=4 * AT.hidden)
    tuned_at = replace(AT, M=1)
    assert fit_to(split, tuned_at, longer, "bf16", HOPPER).split_k == 8  # 4x the K steps, 4x the programs
    assert fit_to(split, tuned_at, replace(longer, hidden=AT.hidden // 4), "bf16", HOPPER).split_k == 1
    full = replace(longer, M=4096)  # the unsplit grid fills two waves: no split (the split-full rule)
    assert fit_to(split, tuned_at, full, "bf16", HOPPER).split_k == 1


def test_a_split_is_carried_down_so_a_longer_k_adds_one_only_where_it_holds_the_steps_again():
    """A split rounds down: K 1.41x longer (gpt-oss-120b's 2880 against Qwen3's 2048) adds no split to a config
    tuned without one, nor a GEMM2 split to one tuned with none; twice the K doubles a split, 1.41x keeps it."""
    tuned_at = replace(AT, M=1)
    wider = replace(tuned_at, hidden=2880, intermediate=1080)  # 23 K steps against 16; GEMM2's 9 against 6
    assert fit_to(BASE, tuned_at, wider, "bf16", HOPPER).split_k == 1
    assert fit_to(BASE, tuned_at, wider, "bf16", HOPPER).gemm2_split_k == 1
    split = replace(BASE, split_k=2, direct_route=True)
    assert fit_to(split, tuned_at, wider, "bf16", HOPPER).split_k == 2
    assert fit_to(split, tuned_at, replace(wider, hidden=2 * AT.hidden), "bf16", HOPPER).split_k == 4


def test_gemm2_walks_more_column_tiles_where_its_k_is_shorter():
    walk = replace(BASE, gemm2_n_tiles=1)
    shorter = replace(AT, intermediate=AT.intermediate // 4)  # 6 K steps of GEMM2 where tuned, 2 here
    assert fit_to(walk, AT, shorter, "bf16", HOPPER).gemm2_n_tiles == 4
    assert fit_to(replace(walk, gemm2_split_k=2), AT, shorter, "bf16", HOPPER).gemm2_n_tiles == 1


def test_a_tall_tile_is_lowered_to_what_a_busy_expert_fills():
    tall = TileConfig(128, 128, 64, 8, 8, 3, tail_tiles=2)
    decode = replace(AT, M=1)
    out = fit_to(tall, replace(AT, M=4096), decode, "bf16", HOPPER)
    assert out.BLOCK_SIZE_M == 64 and out.BLOCK_SIZE_M >> out.tail_tiles >= 16


def test_stages_are_lowered_to_fit_shared_memory_at_the_targets_element_size():
    deep = TileConfig(64, 128, 128, 1, 8, 4)  # 4 stages of 1-byte operands fit (160 KiB); of 2-byte ones not
    assert fit_to(deep, AT, AT, "fp8-tensor", HOPPER).num_stages == 4
    assert fit_to(deep, AT, AT, "bf16", HOPPER).num_stages < 4


def test_a_table_of_another_shape_is_placed_at_its_own_sizes():
    """The point a table key stands for is that table's shape at that M (not the target's)."""
    t = Tuned("x.json", 256, 256, 7168, 8, "fp8-block128", "NVIDIA H200", ConfigTable({32: BASE}))
    assert t.at(32) == Where(32, 256, 8, 7168, 256)


def test_slots_past_every_tuned_point_fit_from_the_largest():
    """A prefill point with more slots per expert than any tuned one is as near as SATURATED_SLOTS allows:
    Mixtral at M=4096 (1,024 slots per expert) fits from a table tuned up to 128, not the heuristic."""
    prefill = TileConfig(128, 128, 64, 8, 8, 3, gemm1_merged=True)
    t = Tuned("x.json", 16, 4096, 5120, 1, "bf16", "NVIDIA H200", ConfigTable({1024: BASE, 2048: prefill}))
    mixtral = Where(4096, 8, 2, 4096, 14336)
    assert mixtral.slots / mixtral.experts == 8 * SATURATED_SLOTS
    got = Fit([t]).predict(mixtral, "bf16", HOPPER)
    assert got is not None and got.table_m == 2048
    assert Where(2048, 16, 1, 5120, 4096).features()[0] == math.log2(SATURATED_SLOTS)


def test_gemm2_tiles_that_leave_a_partial_column_tile_keep_room_for_an_output_tile():
    """The config that asked 278,528 bytes on gpt-oss-20b (hidden 2880) at s3, four 256-wide GEMM2 tiles per
    program, is carried there at s2; where 256 divides hidden (Mixtral's 4096, its own table's shape) it keeps
    s3. One such tile per program (gpt-oss-20b's own prefill configs) keeps its stages on gpt-oss-20b too."""
    wide = TileConfig(128, 128, 64, 8, 8, 3, gemm2_block_n=256, gemm2_n_tiles=4, gemm1_merged=True)
    mixtral, gpt = Where(2048, 8, 2, 4096, 14336), Where(4096, 32, 4, 2880, 2880)
    assert gemm2_smem_bytes(wide, 2, gpt.hidden) == 278_528 > HOPPER.smem_bytes
    assert fit_to(wide, mixtral, gpt, "bf16", HOPPER).num_stages == 2
    assert fit_to(wide, mixtral, mixtral, "bf16", HOPPER).num_stages == 3
    one = replace(wide, num_stages=4, gemm2_n_tiles=1)
    assert gemm2_smem_bytes(one, 2, gpt.hidden) == 196_608 <= HOPPER.smem_bytes
    assert fit_to(one, gpt, gpt, "bf16", HOPPER).num_stages == 4


def test_an_empty_batch_is_placed_as_one_token():
    """fused_moe accepts M = 0; the lookup asks the fit for it then."""
    (entry,) = [e for e in SERVED if e.dtype == "fp8-block128"][:1]
    w = where_of(entry, 0)
    got, one = (EVERYWHERE.predict(where_of(entry, M), entry.dtype, HOPPER) for M in (0, 1))
    assert (got.table.name, got.table_m) == (one.table.name, one.table_m)
    assert_runnable(got.config, w, entry.dtype)
