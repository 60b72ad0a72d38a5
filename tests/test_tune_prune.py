"""The pruning rules, each on its own with cases that say why, then on the recorded exhaustive H200 tunes: the
shared-memory rule lets through all that Triton runs, and the rules keep every config the recording timed."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pandas as pd
import pytest

from moebench.hardware import HOPPER
from moebench.models import get_model, shard
from moebench.problem import Problem
from moebench.space import prune as prune_module
from moebench.space.declared import get_space
from moebench.space.prune import (
    RULES,
    Facts,
    block_scale,
    prune,
    registers,
    same_order,
    shared_memory,
    tall_tile,
)
from moebench.tile import TileConfig
from moebench.tune.record import ENGINE

RECORDED = Path(__file__).parent / "data" / "h200-tune-exhaustive"  # screen times of exhaustive H200 tunes
# The recordings, named by file, with the shape and dtype each tuned (as ``moebench tune`` builds them).
RECORDINGS = {
    "qwen3-30b-a3b-bf16": (lambda: get_model("qwen3-30b-a3b"), "bf16"),
    "deepseek-v3-tp8-fp8-block128": (lambda: shard(get_model("deepseek-v3"), tp=8), "fp8-block128"),
}


def facts(M: int = 1, dtype: str = "bf16", kernel: str = "triton-classic", **changes) -> Facts:
    """Qwen3-30B-A3B's facts (128 experts, top 8) on an H200, with ``changes``."""
    return replace(Facts.of(Problem(get_model("qwen3-30b-a3b"), M, dtype), kernel, HOPPER), **changes)


# --- block-scale -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel, block_k, dropped", [
    ("triton-classic", 64, False),  # two steps within one 128-wide scale block: the engines' kernel runs it
    ("triton-classic", 128, False),  # one scale block a step
    ("triton-classic", 256, True),  # a step spans two scale blocks, which one scale cannot cover
    ("triton", 64, True),  # moebench's kernel reads one scale block a step, no more, no less
    ("triton", 128, False),
    ("triton", 256, True),
])
def test_block_scale_keeps_only_k_steps_a_128_scale_block_covers(kernel, block_k, dropped):
    cfg = TileConfig(64, 128, block_k)
    assert block_scale(cfg, facts(dtype="fp8-block128", kernel=kernel)) is dropped
    assert not block_scale(cfg, facts(dtype="fp8-channel", kernel=kernel))  # no block scales: any step runs


# --- shared-memory -----------------------------------------------------------------------------------------

def test_shared_memory_keeps_a_config_at_the_bound_and_drops_one_a_byte_over():
    cfg = TileConfig(64, 128, 128, num_stages=4)
    # One stage short of num_stages: 3 stages of (64 A rows + 128 weight columns) x 128 deep x 2 bytes.
    need = (64 + 128) * 128 * 2 * 3
    assert not shared_memory(cfg, facts(smem_bytes=need))
    assert shared_memory(cfg, facts(smem_bytes=need - 1))
    assert not shared_memory(cfg, facts(dtype="fp8-block128", smem_bytes=need // 2))  # fp8 halves the tiles
    assert shared_memory(cfg, facts(kernel="triton", smem_bytes=need))  # moebench's GEMM1 loads gate and up
    assert not shared_memory(cfg, facts(kernel="triton", smem_bytes=(64 + 2 * 128) * 128 * 2 * 3))


def test_shared_memory_keeps_a_config_over_the_limit_only_when_every_stage_is_counted():
    cfg = TileConfig(64, 32, 256, num_stages=5)  # bf16: 48 KiB a stage
    per_stage = (64 + 32) * 256 * 2
    assert per_stage * 4 <= HOPPER.smem_bytes < per_stage * 5  # the case is what it says
    assert not shared_memory(cfg, facts())


# --- registers ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel, bm, bn, warps, acc, dropped", [
    ("triton-classic", 128, 128, 4, 128, False),  # 128 fp32 accumulators a thread
    ("triton-classic", 128, 256, 4, 256, True),  # 256: one more than the 255 registers a thread has
    ("triton-classic", 128, 256, 8, 128, False),  # two warpgroups share the tile
    ("triton-classic", 256, 256, 8, 256, True),
    ("triton", 128, 128, 4, 256, True),  # moebench's GEMM1 holds gate and up accumulators
    ("triton", 64, 128, 4, 128, False),
])
def test_registers_drops_tiles_whose_accumulators_alone_overflow_a_thread(kernel, bm, bn, warps, acc, dropped):
    f = facts(kernel=kernel)
    assert f.b_tiles * bm * bn // (32 * warps) == acc  # the case is what it says
    assert registers(TileConfig(bm, bn, 64, num_warps=warps), f) is dropped


def test_registers_bound_is_255_and_inclusive(monkeypatch):
    assert prune_module.MAX_ACC_REGS == 255  # NVIDIA GPUs give a thread at most 255 registers
    cfg = TileConfig(128, 256, 64, num_warps=4)  # 256 accumulators a thread
    assert registers(cfg, facts())
    monkeypatch.setattr(prune_module, "MAX_ACC_REGS", 256)
    assert not registers(cfg, facts())


# --- tall-tile ---------------------------------------------------------------------------------------------

def test_tall_tile_at_decode_keeps_the_wgmma_height_and_drops_taller():
    f = facts(M=1)  # 8 slots over 128 experts: a busy expert holds one slot
    assert f.busy < 1
    assert not tall_tile(TileConfig(64, 64, 64), f)  # 64 rows: the wgmma tile height, never dropped
    assert tall_tile(TileConfig(128, 64, 64), f)
    assert not tall_tile(TileConfig(128, 64, 64, direct_route=True), f)  # a tile per slot: no padding to save


def test_tall_tile_at_prefill_keeps_tiles_a_busy_expert_fills():
    f = facts(M=4096)  # 256 slots an expert on average
    assert f.busy > 256
    assert not tall_tile(TileConfig(256, 128, 64), f)


def test_tall_tile_drops_a_tile_only_where_half_of_it_holds_a_busy_expert():
    f = facts(M=640)  # 40 slots an expert on average, a busy one about 53
    assert 32 < f.busy <= 64
    assert not tall_tile(TileConfig(128, 64, 64), f)  # half of it (64 rows) would not hold a busy expert
    assert tall_tile(TileConfig(256, 64, 64), f)
    assert 256 // 2 >= f.busy  # why: 128 rows hold every such expert in one tile too


# --- same-order --------------------------------------------------------------------------------------------

@cache
def program_order(num_pid_m: int, num_pid_n: int, group_m: int) -> tuple[tuple[int, int], ...]:
    """(pid_m, pid_n) of each program id in launch order under the grouped (L2 swizzle) ordering: programs
    walk ``group_m`` row tiles down a column tile before moving to the next column, a group of rows at a time;
    the last group holds the row tiles left."""
    order = []
    in_group = group_m * num_pid_n
    for pid in range(num_pid_m * num_pid_n):
        first = pid // in_group * group_m
        rows = min(num_pid_m - first, group_m)
        order.append((first + pid % in_group % rows, pid % in_group // rows))
    return tuple(order)


def test_the_simulated_order_visits_every_tile_once_and_depends_on_small_groups():
    for m, n, g in [(20, 3, 1), (20, 3, 16), (7, 5, 64)]:
        assert sorted(program_order(m, n, g)) == [(i, j) for i in range(m) for j in range(n)]
    assert program_order(20, 3, 1) != program_order(20, 3, 16)  # the simulation tells groups apart


@pytest.mark.parametrize("num_pid_m", [1, 5, 16, 17, 64])
def test_every_group_at_or_above_the_row_tiles_gives_one_order(num_pid_m):
    groups = [g for g in get_space("triton-classic").engine if g.name == "GROUP_SIZE_M"][0].values
    orders = {program_order(num_pid_m, 6, g) for g in groups if g >= num_pid_m}
    assert len(orders) <= 1


@pytest.mark.parametrize("kernel", ["triton-classic", "triton"])
def test_same_order_keeps_the_smallest_group_the_kernels_space_searches(kernel):
    """With one row tile, every group gives one order: the rule keeps only the smallest value of the kernel's
    own space (moebench's kernel searches 8, the engines' form does not)."""
    searched = [d for d in get_space(kernel).engine if d.name == "GROUP_SIZE_M"][0].values
    f = Facts(kernel, 5, 64, 1, 1024, 512, 2, False, 227 * 1024)  # five slots of 64 experts
    cfg = TileConfig(16, 64, 64, 1, 4, 3)
    rows = f.row_tiles(cfg)
    assert 1 < rows <= 8
    kept = [g for g in searched if not same_order(replace(cfg, GROUP_SIZE_M=g), f)]
    assert kept == [g for g in searched if g < rows] + [min(g for g in searched if g >= rows)]
    assert kept[-1] == (8 if kernel == "triton" else 16)


@pytest.mark.parametrize("name", RECORDINGS)
def test_same_order_drops_only_duplicates_of_a_config_it_keeps(name):
    shape, dtype = RECORDINGS[name][0](), RECORDINGS[name][1]
    space = get_space("triton-classic")
    groups = [d for d in space.engine if d.name == "GROUP_SIZE_M"][0].values
    others = [r for r in RULES if r.name != "same-order"]
    dropped_any = False
    for M in (1, 16, 256, 4096):
        f = Facts.of(Problem(shape, M, dtype), "triton-classic", HOPPER)
        kept = {c.key() for c in prune(space.engine_configs(), f)[0]}
        for cfg in space.engine_configs():
            if not same_order(cfg, f) or any(r.drops(cfg, f) for r in others):
                continue
            dropped_any = True
            rows = f.row_tiles(cfg)
            twin = replace(cfg, GROUP_SIZE_M=min(g for g in groups if g >= rows))
            assert twin.key() in kept, f"M={M} {cfg.label}: its twin {twin.label} is not kept"
            for n in (2 * f.intermediate, f.hidden):  # GEMM1's gate and up columns, GEMM2's
                cols = -(-n // cfg.BLOCK_SIZE_N)
                assert program_order(rows, cols, cfg.GROUP_SIZE_M) == program_order(rows, cols, twin.GROUP_SIZE_M)
    assert dropped_any  # the rule drops something on this shape: the test reaches it


# --- prune -------------------------------------------------------------------------------------------------

def test_prune_counts_a_config_under_the_first_rule_that_drops_it():
    f = facts(M=1, dtype="fp8-block128")
    cfg = TileConfig(256, 64, 256)  # a K step across two scale blocks and a tall tile at decode
    assert block_scale(cfg, f) and tall_tile(cfg, f)
    kept, dropped = prune([cfg, TileConfig(16, 64, 128)], f)
    assert [c.label for c in kept] == [TileConfig(16, 64, 128).label]
    assert dropped == {"block-scale": 1, "shared-memory": 0, "registers": 0, "tall-tile": 0, "same-order": 0}
    _, dropped = prune([cfg], f, rules=RULES[::-1])
    assert dropped["tall-tile"] == 1 and dropped["block-scale"] == 0


# --- on the recordings -------------------------------------------------------------------------------------

@cache
def recording(name: str) -> tuple[pd.DataFrame, dict[int, Facts]]:
    df = pd.read_csv(RECORDED / f"{name}.csv.gz", keep_default_na=False, na_values={"time_us": [""]})
    shape, dtype = RECORDINGS[name][0](), RECORDINGS[name][1]
    ms = sorted({int(m) for m in df["M"]})
    return df, {M: Facts.of(Problem(shape, M, dtype), "triton-classic", HOPPER) for M in ms}


def configs_of(rows: pd.DataFrame) -> list[TileConfig]:
    return [TileConfig(**{k: int(getattr(r, k)) for k in ENGINE}) for r in rows.itertuples(index=False)]


@pytest.mark.parametrize("name", RECORDINGS)
def test_triton_not_the_rule_stopped_every_recorded_resources_failure(name):
    df, by_m = recording(name)
    f = by_m[min(by_m)]
    failed = configs_of(df[df["failure"] == "resources"])
    assert failed, "the recording has no resources failure to check"
    for cfg in failed:
        all_stages = (cfg.BLOCK_SIZE_M + f.b_tiles * cfg.BLOCK_SIZE_N) * cfg.BLOCK_SIZE_K * f.operand_bytes
        assert all_stages * cfg.num_stages > f.smem_bytes, f"{cfg.label} failed within shared memory"
    ok = configs_of(df[df["status"] == "ok"])
    assert not [c.label for c in ok if shared_memory(c, f)], "a config Triton ran is over the rule's bound"


@pytest.mark.parametrize("name", RECORDINGS)
def test_prune_keeps_every_config_the_recording_timed_at_each_m(name):
    df, by_m = recording(name)
    space = get_space("triton-classic")
    for M, f in by_m.items():
        kept = {c.key() for c in prune(space.engine_configs(), f)[0]}
        timed = configs_of(df[(df["M"] == M) & (df["phase"] == "screen") & (df["status"] == "ok")])
        assert timed
        lost = [c.label for c in timed if c.key() not in kept]
        assert not lost, f"M={M}: the rules now drop {len(lost)} recorded configs, e.g. {lost[:3]}"
