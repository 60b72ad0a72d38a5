"""Tables in use: where the triton path's tile config comes from (--configs, MOEBENCH_CONFIGS, shipped,
heuristic), the nearest M, and a sweep whose rows say which it used."""

from __future__ import annotations

import pytest

from moebench.bench.spec import Block, SweepSpec
from moebench.bench.sweep import run_sweep, validate
from moebench.environment import device_name
from moebench.errors import UserError
from moebench.models import get_model
from moebench.paths.base import Target
from moebench.paths.registry import get_path
from moebench.store.runfolder import load_run
from moebench.tables import lookup
from moebench.tables.formats.moebench import TableMeta, file_name, table_text
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig

TINY = get_model("tiny")  # E=8, I=64
HEURISTIC = TileConfig(16, 64, 128, 1, 4, 4)
AT_4 = TileConfig(16, 32, 32, 1, 2, 2)  # differ from the heuristic and from each other
AT_64 = TileConfig(32, 32, 64, 1, 4, 2)


def write(folder, dtype="fp32", device="NVIDIA H200", experts=8, n=64) -> None:
    meta = TableMeta(device_name=device, dtype=dtype, shape={"experts": experts, "intermediate": n, "hidden": 128,
                                                             "topk": 2})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / file_name(experts, n, device, dtype)).write_text(table_text(meta, ConfigTable({4: AT_4, 64: AT_64})))


@pytest.fixture(autouse=True)
def no_env_or_shipped(monkeypatch, tmp_path):
    monkeypatch.delenv(lookup.ENV_VAR, raising=False)
    monkeypatch.setattr(lookup, "SHIPPED_DIR", tmp_path / "shipped")  # empty unless a test writes there


def choose(M, configs_dir=None, dtype="fp32", device="NVIDIA H200"):
    return lookup.choose(M, 8, 64, dtype, device, HEURISTIC, configs_dir)


@pytest.mark.parametrize("M, key", [(1, 4), (5, 4), (34, 4), (35, 64), (50, 64), (4096, 64)])
def test_a_table_in_the_configs_folder_is_read_at_the_nearest_m(tmp_path, M, key):
    """As vLLM looks M up: the key nearest M, the smaller on a tie (34 is 30 from 4 and 30 from 64)."""
    write(tmp_path / "mine")
    got = choose(M, tmp_path / "mine")
    assert got.source == "configs" and got.table_m == key
    assert got.config == {4: AT_4, 64: AT_64}[key]
    assert got.label == f"configs:{got.table.name}@M={key}"


def test_the_order_is_configs_then_env_then_shipped_then_heuristic(tmp_path, monkeypatch):
    for name in ("mine", "env", "shipped"):
        write(tmp_path / name)
    monkeypatch.setenv(lookup.ENV_VAR, str(tmp_path / "env"))
    assert choose(4, tmp_path / "mine").source == "configs"
    assert choose(4, tmp_path / "elsewhere").source == "env"  # a folder without the file falls through
    monkeypatch.delenv(lookup.ENV_VAR)
    assert choose(4).source == "shipped"
    (tmp_path / "shipped" / file_name(8, 64, "NVIDIA H200", "fp32")).unlink()
    assert choose(4) == lookup.Chosen(HEURISTIC, "heuristic")


@pytest.mark.parametrize("other", [{"dtype": "fp16"}, {"device": "NVIDIA H100"}])
def test_a_table_of_another_dtype_or_device_is_not_used(tmp_path, other):
    write(tmp_path / "mine", **{"dtype": "fp32", "device": "NVIDIA H200", **other})
    assert choose(4, tmp_path / "mine").source == "heuristic"


def test_a_configs_folder_that_does_not_exist_is_one_line(tmp_path):
    with pytest.raises(UserError, match="no such folder"):
        lookup.check_dir(tmp_path / "missing")


def test_a_sweep_runs_the_tables_config_and_each_row_says_where_it_came_from(tmp_path):
    """The triton path at M=1 and M=50 runs the table's configs (keys 4 and 64), checked correct against the
    reference; the torch reference has no config and no source."""
    write(tmp_path / "mine", device=device_name())
    spec = SweepSpec("t", (Block((TINY,), (1, 50), ("fp32",), ("torch", "triton")),))
    plan = validate(spec, Target.current(), configs_dir=tmp_path / "mine")
    _, df = load_run(run_sweep(plan, tmp_path / "runs"))
    triton = df[df["path"] == "triton"].set_index("M")
    assert triton.loc[1, "config"] == AT_4.as_dict() and triton.loc[50, "config"] == AT_64.as_dict()
    assert triton.loc[1, "config_source"].startswith("configs:") and triton.loc[1, "config_source"].endswith("@M=4")
    assert (triton["status"] == "ok").all() and triton["correct"].all()
    assert df.loc[df["path"] == "torch", "config_source"].isna().all()
    plain = validate(spec, Target.current())  # no table for this device: the heuristic
    (point,) = [p for p in plain.points if p.path_name == "triton" and p.problem.M == 1]
    assert point.source == "heuristic" and point.tiles == (get_path("triton").default_config(point.problem),)
