"""Tile configs: each field declared once in ``tile.FIELDS``, and what is derived from the declaration."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from moebench.errors import UserError
from moebench.hardware import HOPPER, DeviceLimits
from moebench.tile import DEFAULTS, FIELD, FIELDS, TileConfig, default_config, fit_stages, short_label, smem_bytes

BASE = TileConfig(64, 128, 64, 8, 4, 3)
ENGINE_KEYS = ["BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"]


def _off_value(name: str):
    """A value of a moebench-only field away from its default that validates on its own (or with BASE)."""
    default = DEFAULTS[name]
    if isinstance(default, bool):
        return not default
    return {"gemm2_block_n": 256, "tail_tiles": 1}.get(name, 2)


def _turned_on(name: str) -> TileConfig:
    """BASE with ``name`` away from its default, and what that field needs set with it."""
    needs = {"gemm1_quant_x": {"direct_route": True}, "gemm2_preload": {"direct_route": True}}
    return replace(BASE, **needs.get(name, {}), **{name: _off_value(name)})


def test_every_field_is_declared_exactly_once():
    names = [f.name for f in FIELDS]
    assert len(names) == len(set(names))
    assert set(names) == {f.name for f in fields(TileConfig)}
    for f in FIELDS:
        assert f.doc and (f.mark or f.name.startswith("BLOCK_SIZE_")), f.name
        assert not f.default_as or f.default_as in FIELD


def test_the_engine_fields_are_the_six_keys_of_vllm_files_in_their_order():
    assert [f.name for f in fields(TileConfig) if FIELD[f.name].engine] == ENGINE_KEYS
    assert list(BASE.to_vllm_dict()) == ENGINE_KEYS
    assert BASE.to_vllm_dict() == {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
                                   "num_warps": 4, "num_stages": 3}


@pytest.mark.parametrize("name", [f.name for f in FIELDS if not f.engine])
def test_a_moebench_only_field_away_from_its_default_is_not_portable(name):
    """Portable (the engines run it as written) is derived: every moebench-only field at its default."""
    assert BASE.portable
    assert not _turned_on(name).portable


def test_gemm2_at_gemm1s_width_is_portable():
    """gemm2_block_n equal to BLOCK_SIZE_N means what its default (0) means: the engines run it."""
    assert replace(BASE, gemm2_block_n=BASE.BLOCK_SIZE_N).portable
    assert not replace(BASE, gemm2_block_n=2 * BASE.BLOCK_SIZE_N).portable


def test_portable_matches_the_rule_it_replaces():
    """The derived rule agrees with the hand-written one it replaced, over a config per moebench-only field."""
    def hand_written(c: TileConfig) -> bool:
        return (not c.swap_ab and c.atomic_sum and c.split_k == 1 and not c.direct_route
                and c.gemm2_block_n in (0, c.BLOCK_SIZE_N) and c.gemm2_n_tiles == 1 and not c.gemm1_merged
                and not c.gemm1_tma and not c.atomic_out and c.gemm2_split_k == 1 and not c.gemm2_columns_first
                and not c.tail_tiles)

    for c in [BASE, *(_turned_on(f.name) for f in FIELDS if not f.engine)]:
        assert c.portable == hand_written(c), c


@pytest.mark.parametrize("config, label", [
    (BASE, "64x128x64 w4 s3 g8"),  # GROUP_SIZE_M above 1 is named; warps and stages always are
    (TileConfig(16, 64, 128, 1, 4, 4), "16x64x128 w4 s4"),
    (replace(BASE, GROUP_SIZE_M=1, swap_ab=True, atomic_sum=False, split_k=4, gemm1_tma=True),
     "64x128x64 w4 s3 swap stored-sum split4 tma"),
    (replace(BASE, atomic_out=True, split_k=4, gemm2_split_k=2), "64x128x64 w4 s3 g8 out-sum split4 g2split2"),
    (replace(BASE, direct_route=True, gemm2_preload=True, gemm1_quant_x=True),
     "64x128x64 w4 s3 g8 direct quant-x preload"),
    (replace(BASE, gemm2_block_n=256, gemm2_n_tiles=4, gemm1_merged=True, gemm2_columns_first=True, tail_tiles=1),
     "64x128x64 w4 s3 g8 n2=256 n2tiles=4 merged cols-first tail1"),
    (replace(BASE, gemm2_block_n=128), "64x128x64 w4 s3 g8"),  # GEMM1's width: as if unset
])
def test_short_labels(config, label):
    assert config.label == label == short_label(config.as_dict())


def test_a_short_label_of_an_older_rows_config_reads_missing_fields_as_defaults():
    """Rows of older runs lack the later fields: those count as at their default."""
    old = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 4, "swap_ab": True}
    assert short_label(old) == "16x64x128 w4 s4 swap"


def test_every_moebench_only_field_shows_in_a_short_label_when_set():
    """A config's label names each field set away from its default, so two distinct configs read apart."""
    for f in FIELDS:
        if f.engine:
            continue
        on = _turned_on(f.name)
        assert f.mark.format(getattr(on, f.name)) in on.label.split(), f.name


def test_validation_stays_per_field():
    with pytest.raises(UserError, match="BLOCK_SIZE_N"):
        TileConfig(16, 48, 64)
    with pytest.raises(UserError, match="atomic_out"):
        replace(BASE, atomic_sum=False, atomic_out=True)
    with pytest.raises(UserError, match="unknown key"):
        TileConfig.from_dict({**BASE.as_dict(), "block_m": 16})


def test_from_dict_round_trips_every_field():
    c = replace(BASE, swap_ab=True, split_k=2, tail_tiles=1)
    assert TileConfig.from_dict(c.as_dict()) == c
    assert TileConfig.from_dict(c.to_vllm_dict()) == replace(c, swap_ab=False, split_k=1, tail_tiles=0)


def test_stages_fit_the_shared_memory_of_the_device_given():
    """num_stages is lowered until the operand tiles fit the limits passed; the default is the current
    device (an H100/H200 where there is no GPU)."""
    tall = TileConfig(128, 128, 128, 8, 8, 4)  # 4 stages of (128 + 256) x 128 x 2 bytes: 384 KB
    fitted = fit_stages(tall, 2, HOPPER)
    assert smem_bytes(fitted, 2) <= HOPPER.smem_bytes < smem_bytes(replace(fitted, num_stages=3), 2)
    assert fitted.num_stages == 2
    small = DeviceLimits(sms=HOPPER.sms, l2_bytes=HOPPER.l2_bytes, smem_bytes=100 * 1024)
    assert fit_stages(tall, 2, small).num_stages == 1
    if DeviceLimits.current() == HOPPER:
        assert fit_stages(tall, 2) == fitted
        assert default_config(4096, 8, 2) == default_config(4096, 8, 2, limits=HOPPER)
