"""The declared search spaces: the engines' form is the product vLLM's tuner searches, every point of it a valid
``TileConfig`` the engines run, and the second stage's steps change one of moebench's own fields at a time."""

from __future__ import annotations

from math import prod

import pytest

from moebench.errors import UserError
from moebench.space import declared as space_module
from moebench.space.declared import Dim, get_space
from moebench.tile import DEFAULTS, FIELDS, TileConfig

# The ranges vLLM's benchmarks/kernels/benchmark_moe.py searches on CUDA (get_configs_compute_bound): a fact
# about vLLM, not a result of moebench.
VLLM_RANGES = {
    "BLOCK_SIZE_M": (16, 32, 64, 128, 256),
    "BLOCK_SIZE_N": (32, 64, 128, 256),
    "BLOCK_SIZE_K": (64, 128, 256),
    "GROUP_SIZE_M": (1, 16, 32, 64),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
}
ENGINE_FIELDS = {f.name for f in FIELDS if f.engine}
OWN_FIELDS = {f.name for f in FIELDS if not f.engine}


def test_the_engine_form_searches_vllms_ranges_and_their_whole_product():
    space = get_space("triton-classic")
    assert {d.name: d.values for d in space.engine} == VLLM_RANGES
    assert space.own == ()
    size = prod(len(v) for v in VLLM_RANGES.values())  # 5 x 4 x 3 x 4 x 2 x 4
    configs = list(space.engine_configs())
    assert space.size == len(configs) == size
    assert len({c.key() for c in configs}) == size, "engine_configs yields a config twice"
    assert f"{size:,} configs" in space_module.__doc__, "the module docstring names another size"


@pytest.mark.parametrize("path", ["triton-classic", "triton"])
def test_every_engine_config_is_a_valid_portable_tile_config(path):
    space = get_space(path)
    values = {d.name: set(d.values) for d in space.engine}
    for cfg in space.engine_configs():
        assert cfg.portable, f"{cfg.label}: a moebench-only field is on in the engine stage"
        assert TileConfig.from_dict(cfg.as_dict()) == cfg  # passes TileConfig's own checks
        assert set(cfg.to_vllm_dict()) == ENGINE_FIELDS
        assert all(getattr(cfg, name) in vs for name, vs in values.items()), cfg.label


def test_moebenchs_space_adds_each_own_field_from_its_off_position():
    classic, ours = get_space("triton-classic"), get_space("triton")
    # the six searched the same way in both forms, but GROUP_SIZE_M also at 8 in moebench's kernel
    assert [d.name for d in ours.engine] == [d.name for d in classic.engine]
    for mine, theirs in zip(ours.engine, classic.engine):
        extra = set(mine.values) - set(theirs.values)
        assert set(theirs.values) <= set(mine.values) and extra == ({8} if mine.name == "GROUP_SIZE_M" else set())
    assert {d.name for d in ours.own} == OWN_FIELDS  # every moebench-only field of tile.FIELDS
    for d in ours.own:
        assert d.values[0] == DEFAULTS[d.name], f"{d.name}: the first value is not the field's default"
        assert len(set(d.values)) == len(d.values) > 1, d.name
    rows = ours.describe()
    assert [r["name"] for r in rows] == [d.name for d in ours.dims]
    assert [r["stage"] for r in rows] == ["engine"] * len(ours.engine) + ["own"] * len(ours.own)


# Bases for the second stage's steps, each with a reason.
BASES = [
    TileConfig(128, 128, 64, 16, 8, 3),  # a prefill tile: tail tiles fit (128 >> 2 = 32 rows)
    TileConfig(16, 64, 128, 1, 4, 4),  # a decode tile: no tail tile fits under 16 rows
    TileConfig(16, 64, 128, direct_route=True),  # a tile per slot: quant-x and preload become possible
    TileConfig(64, 128, 128, atomic_sum=False),  # stored sum: gemm2 split-k and the atomic output are refused
    TileConfig(64, 64, 64, gemm1_merged=True),  # merged GEMM1: TMA weights are refused
]


@pytest.mark.parametrize("base", BASES, ids=lambda c: c.label)
def test_a_neighbour_changes_one_own_field_to_a_declared_value(base):
    space = get_space("triton")
    own = {d.name: d.values for d in space.own}
    steps = list(space.neighbours(base))
    assert steps, "no step from the base"
    assert len({s.key() for s in steps}) == len(steps), "a step is yielded twice"
    for s in steps:
        changed = [f.name for f in FIELDS if getattr(s, f.name) != getattr(base, f.name)]
        assert len(changed) == 1 and changed[0] in own, f"{s.label}: changed {changed}"
        assert getattr(s, changed[0]) in own[changed[0]]
        assert TileConfig(**s.as_dict()) == s


def test_neighbours_skip_the_combinations_tile_config_refuses_and_keep_the_rest():
    space = get_space("triton")

    def changes(base, name):
        return {getattr(s, name) for s in space.neighbours(base) if getattr(s, name) != getattr(base, name)}

    prefill, decode, direct, stored, merged = BASES
    assert changes(prefill, "tail_tiles") == {1, 2}
    assert changes(decode, "tail_tiles") == set()  # 16 rows >> 1 is under 16
    assert changes(decode, "gemm1_quant_x") == set()  # needs direct_route
    assert changes(direct, "gemm1_quant_x") == {True}
    assert changes(direct, "gemm2_preload") == {True}
    assert changes(direct, "tail_tiles") == set()  # tail tiles are for the align step's tiles
    assert changes(stored, "gemm2_split_k") == set() and changes(stored, "atomic_out") == set()
    assert changes(prefill, "gemm2_split_k") == {2, 4, 8}
    assert changes(merged, "gemm1_tma") == set()
    with pytest.raises(UserError):  # the precondition: TileConfig does refuse what the steps skip
        TileConfig(**{**decode.as_dict(), "gemm1_quant_x": True})


def test_the_engine_form_has_no_second_stage():
    assert list(get_space("triton-classic").neighbours(BASES[0])) == []


def test_an_unknown_path_has_no_space_and_says_so_in_one_line():
    with pytest.raises(UserError, match="no search space for path 'cutlass'") as e:
        get_space("cutlass")
    assert "\n" not in str(e.value) and "triton-classic" in str(e.value)


def test_a_dimension_must_name_a_tile_field_and_have_values():
    with pytest.raises(ValueError, match="not a TileConfig field"):
        Dim("BLOCK_M", (16,), "a vLLM kernel argument, not a config key")
    with pytest.raises(ValueError, match="no values"):
        Dim("BLOCK_SIZE_M", (), "")
