"""Which tables the fitted default (``tables.fitted``) draws from: only the tables of the device it fits for,
whether it is reached through ``fit_of``, the lookup (``tables.lookup``) or ``moebench fit-check``; and for
fp8-block128 only fp8-block128 tables, never another fp8 class's or a 16-bit one's.

Each case puts the bait (a table of another device, or of another dtype class) nearer the target than any
table the fit may read, so a fit that read it would choose it."""

from __future__ import annotations

import json
import math

import pytest
from helpers import moebench_in_process

from moebench.hardware import HOPPER
from moebench.tables import lookup
from moebench.tables.fitted import CLASS_OF, Fit, Tuned, Where, fit_of
from moebench.tables.formats.moebench import TableMeta, file_name, table_text
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig

HERE, OTHER = "Test GPU A", "Test GPU B"  # devices no shipped table names
CFG = TileConfig(16, 64, 64, 1, 4, 3)
NEAR_CFG = TileConfig(32, 64, 64, 1, 4, 3)  # the bait's config: another tile height, so a pick from it shows
HEURISTIC = TileConfig(16, 64, 128, 1, 4, 4)


def tuned(device: str, experts: int = 64, n: int = 512, hidden: int = 2048, topk: int = 4, dtype: str = "fp16",
          cfg: TileConfig = CFG, ms=(1, 64)) -> Tuned:
    name = file_name(experts, n, device, dtype)
    return Tuned(name, experts, n, hidden, topk, dtype, device, ConfigTable({m: cfg for m in ms}))


def write(folder, t: Tuned) -> None:
    meta = TableMeta(device_name=t.device_name, dtype=t.dtype,
                     shape={"experts": t.experts, "intermediate": t.intermediate, "hidden": t.hidden, "topk": t.topk})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / t.name).write_text(table_text(meta, t.table))


# ---- other devices' tables --------------------------------------------------------------------------------

FAR = tuned(HERE, n=2048, hidden=8192)  # this device's: N and K 4x the target's (distance 2)
BAIT = tuned(OTHER, cfg=NEAR_CFG)  # the other device's: the target's own shape (distance 0)
TARGET = Where(64, 64, 4, 2048, 512)


@pytest.mark.parametrize("device", [HERE, HERE.replace(" ", "_")])  # rows say spaces, file names underscores
def test_the_fit_of_a_device_reads_only_that_devices_tables(device):
    """``fit_of`` keeps the tables of its device: the other device's table at the target's own shape is not
    among them, and the prediction comes from this device's table, farther away."""
    fit = fit_of([FAR, BAIT], device, max_distance=math.inf)
    assert [t.name for t in fit.tables] == [FAR.name]
    got = fit.predict(TARGET, "fp16", HOPPER)
    assert got is not None and got.table.device_name == HERE and got.distance > 0
    assert Fit([FAR, BAIT], max_distance=math.inf).predict(TARGET, "fp16", HOPPER).table is BAIT  # the bait bites


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A --configs folder with tables of two devices; no $MOEBENCH_CONFIGS, no shipped tables."""
    monkeypatch.delenv(lookup.ENV_VAR, raising=False)
    monkeypatch.setattr(lookup, "SHIPPED_DIR", tmp_path / "shipped")
    for t in (FAR, BAIT):
        write(tmp_path / "tables", t)
    return tmp_path / "tables"


def test_the_lookup_fits_from_the_tables_of_its_device(folder):
    """The lookup for a shape with no table of this device reads only this device's tables for the fit (the
    other device's table of this very shape is not read) and runs the config fitted from them."""
    assert [t.name for t in lookup.tuned_tables(folder, HERE)] == [FAR.name]
    assert [t.name for t in lookup.tuned_tables(folder, OTHER)] == [BAIT.name]
    got = lookup.choose(TARGET.M, TARGET.experts, TARGET.intermediate, "fp16", HERE, HEURISTIC, folder,
                        hidden=TARGET.hidden, topk=TARGET.topk)
    assert got.source == "fitted" and got.table.name == FAR.name, got.label
    assert [t.name for t in lookup.fit_for(HERE, folder).tables] == [FAR.name]


def test_fit_check_holds_each_table_out_against_its_own_devices_tables(folder):
    """``moebench fit-check`` fits each held-out table from the other tables of its device: this device's
    table of the target's shape is fitted from its other table, not from the nearer table of the other device
    (of another shape, so holding the target's shape out leaves it in)."""
    write(folder, tuned(HERE))  # this device's table of the target's shape: the one held out below
    write(folder, tuned(OTHER, experts=128, topk=8, cfg=NEAR_CFG))  # as many slots per expert (distance 0.5)
    proc = moebench_in_process("fit-check", "--configs", str(folder), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in json.loads(proc.stdout)["rows"] if r["table"] == tuned(HERE).name]
    assert sorted(r["M"] for r in rows) == [1, 64]  # the held-out table is checked at both keys
    for r in rows:
        assert r["source"].startswith(f"fitted from {FAR.name}@"), r
        assert r["distance"] == pytest.approx(2.0)  # FAR's distance: N and K 4x, at half weight each


# ---- fp8-block128 borrows from no other class -------------------------------------------------------------

@pytest.mark.parametrize("others", [
    ("fp8-tensor",),  # the class nearest in kernel: fp8 scaled after the K loop
    ("fp8-channel", "fp8-tensor-static"),  # the rest of that class
    ("bf16", "fp16"),  # the 16-bit class, which fp8 borrows from
    ("fp8-tensor", "fp8-channel", "bf16"),  # every other class at once
], ids="+".join)
def test_fp8_block128_borrows_from_no_other_class(others):
    """Without an fp8-block128 table fp8-block128 gets no fitted config (the heuristic runs), however near the
    other classes' tables; with one, however far, the fit reads it and no other."""
    near = [tuned(HERE, dtype=d, cfg=TileConfig(16, 64, 128, 1, 4, 3)) for d in others]  # the target's shape
    fit = Fit(near, max_distance=math.inf)
    assert all(CLASS_OF[d] != "fp8-block128" for d in others)
    assert fit.nearest(TARGET, "fp8-block128") == [] and fit.predict(TARGET, "fp8-block128", HOPPER) is None
    assert fit.predict(TARGET, others[0], HOPPER) is not None  # the tables are in reach of their own class
    far_block = tuned(HERE, experts=8, n=4096, hidden=8192, topk=1, dtype="fp8-block128",
                      cfg=TileConfig(16, 64, 128, 1, 4, 3))
    got = Fit([*near, far_block], max_distance=math.inf).predict(TARGET, "fp8-block128", HOPPER)
    assert got is not None and got.table.name == far_block.name


def test_fp8_block128_borrows_from_none_of_the_shipped_tables_of_other_classes():
    """The shipped tables less the fp8-block128 ones give fp8-block128 nothing, at any distance, where they give
    the other fp8 classes a config."""
    shipped = [Tuned.of_file(p) for p in sorted(lookup.SHIPPED_DIR.glob("moebench-tiles_*.json"))]
    others = [t for t in shipped if t is not None and t.dtype != "fp8-block128"]
    assert {CLASS_OF[t.dtype] for t in others} == {"16-bit", "fp8"}  # precondition: both other classes shipped
    fit = Fit(others, max_distance=math.inf)
    for w in (Where(1, 256, 8, 7168, 256), Where(64, 128, 8, 2048, 768), Where(4096, 8, 2, 4096, 14336)):
        assert fit.predict(w, "fp8-block128", HOPPER) is None
        assert fit.predict(w, "fp8-tensor", HOPPER) is not None
