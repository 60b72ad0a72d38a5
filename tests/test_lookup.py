"""Tables in use: where the triton path's tile config comes from (--configs, MOEBENCH_CONFIGS, shipped, the
fitted default of the other tables, heuristic), the nearest M, and a sweep whose rows say which it used."""

from __future__ import annotations

import pytest

from moebench.bench.spec import Block, SweepSpec
from moebench.bench.sweep import run_sweep, validate
from moebench.environment import device_name
from moebench.errors import UserError
from moebench.models import get_model
from moebench.paths.base import Target
from moebench.paths.registry import get_path
from moebench.problem import Problem
from moebench.serve.warmup import plan_for_model
from moebench.store.runfolder import load_run
from moebench.tables import lookup
from moebench.tables.fitted import Where
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
    return lookup.choose(M, 8, 64, dtype, device, HEURISTIC, configs_dir, hidden=128, topk=2)


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


# ---- the fitted default: a shape without a table ------------------------------------------------------------

FP16 = dict(dtype="fp16", n=128)  # a table of another intermediate size, in a dtype with a fit (fp32 has none)


def test_without_its_table_a_shape_runs_the_config_fitted_from_another(tmp_path):
    """E=8, N=64 has no table; the fp16 table of E=8, N=128 (the same E, top-k and hidden) is near enough: at
    M=4 its key 4 (the same slots per expert) is the nearest point, and its config carried to N=64 runs."""
    write(tmp_path / "mine", **FP16)
    got = choose(4, tmp_path / "mine", dtype="fp16")
    name = file_name(8, 128, "NVIDIA H200", "fp16")
    assert (got.source, got.table.name, got.table_m) == ("fitted", name, 4)
    assert got.label == f"fitted from {name}@M=4"
    fitted = lookup.fit_for("NVIDIA H200", tmp_path / "mine").predict(Where(4, 8, 2, 128, 64), "fp16")
    assert got.config == fitted.config and got.config != HEURISTIC


def test_a_table_of_the_shape_wins_over_the_fit(tmp_path):
    write(tmp_path / "mine", **FP16)
    write(tmp_path / "mine", dtype="fp16")  # E=8, N=64 itself
    got = choose(4, tmp_path / "mine", dtype="fp16")
    assert got.source == "configs" and got.config == AT_4


@pytest.mark.parametrize("other", [{"dtype": "fp32"}, {"device": "NVIDIA H100"}])
def test_the_fit_reads_only_tables_of_the_device_and_gives_nothing_for_fp32(tmp_path, other):
    write(tmp_path / "mine", **{**FP16, **other})
    assert choose(4, tmp_path / "mine", **{"dtype": "fp16", **other, "device": "NVIDIA H200"}) == \
        lookup.Chosen(HEURISTIC, "heuristic")


def test_a_broken_table_of_another_shape_is_passed_over_by_the_fit(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / file_name(8, 128, "NVIDIA H200", "fp16")).write_text("{not json")
    assert choose(4, tmp_path / "mine", dtype="fp16") == lookup.Chosen(HEURISTIC, "heuristic")


def test_a_sweep_and_a_warmup_run_the_fitted_config_and_say_so(tmp_path):
    """No kernel runs: the sweep's plan and the warmup's plan name the fit and take its configs."""
    write(tmp_path / "mine", dtype="fp16", device=device_name(), n=128)
    name = file_name(8, 128, device_name(), "fp16")
    spec = SweepSpec("t", (Block((TINY,), (4, 50), ("fp16",), ("triton",)),))  # near the table's keys 4 and 64
    plan = validate(spec, Target.current(), configs_dir=tmp_path / "mine")
    for point in plan.points:
        chosen = lookup.choose(point.problem.M, 8, 64, "fp16", device_name(), HEURISTIC, tmp_path / "mine",
                               hidden=TINY.hidden, topk=TINY.topk)
        assert point.source == chosen.label and point.source.startswith(f"fitted from {name}@M=")
        assert point.tiles == (chosen.config,)
    warm = plan_for_model(TINY, "fp16", tmp_path / "mine", max_tokens=64)
    heuristic = get_path("triton").default_config
    chosen = {M: lookup.choose(M, 8, 64, "fp16", device_name(), heuristic(Problem(TINY, M, "fp16")),
                               tmp_path / "mine", hidden=TINY.hidden, topk=TINY.topk) for M in range(1, 65)}
    rest = "; heuristic elsewhere" if any(c.source == "heuristic" for c in chosen.values()) else ""
    assert warm.source == f"fitted from {name}{rest}"
    assert all(cfg == chosen[M].config for M, cfg in warm.items)


def test_a_fitted_config_the_device_cannot_hold_falls_back_to_the_heuristic_and_stays_refused(tmp_path,
                                                                                             monkeypatch):
    """fused_moe with a fitted config that Triton refuses at its first launch (OutOfResources, as a carried
    GEMM2 tile did on gpt-oss-20b) runs the heuristic's config instead, and the lookup gives the heuristic for
    that shape from then on; another failure is not swallowed."""
    import torch
    import triton

    from moebench.serve import api

    monkeypatch.setattr(lookup, "_REFUSED", set())
    write(tmp_path / "mine", dtype="fp16", device=device_name(), n=128)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 128, generator=gen).half()
    w13 = (torch.randn(8, 128, 128, generator=gen) / 12).half()  # E=8, 2I=128 (I=64), hidden 128
    w2 = (torch.randn(8, 128, 64, generator=gen) / 8).half()
    topk_weights, topk_ids = torch.rand(4, 8, generator=gen).softmax(-1).topk(2)
    first = api.config_for(x, w13, w2, topk_ids, configs_dir=tmp_path / "mine")
    assert first.source == "fitted"
    real, tried = api.launch, []

    def refusing(x, w13, w2, weights, ids, tile, **kw):
        tried.append(tile)
        if tile == first.config:
            raise triton.runtime.errors.OutOfResources(278528, 232448, "shared memory")
        return real(x, w13, w2, weights, ids, tile, **kw)

    monkeypatch.setattr(api, "launch", refusing)
    out = api.fused_moe(x, w13, w2, topk_weights, topk_ids, configs_dir=tmp_path / "mine")
    after = api.config_for(x, w13, w2, topk_ids, configs_dir=tmp_path / "mine")
    assert after.source == "heuristic" and tried == [first.config, after.config]
    want = api.fused_moe(x, w13, w2, topk_weights, topk_ids, config=after.config)
    assert torch.equal(out, want)

    monkeypatch.setattr(lookup, "_REFUSED", set())
    monkeypatch.setattr(api, "launch", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("not a resource")))
    with pytest.raises(RuntimeError, match="not a resource"):
        api.fused_moe(x, w13, w2, topk_weights, topk_ids, configs_dir=tmp_path / "mine")


def test_profile_without_a_config_profiles_what_a_sweep_runs(tmp_path):
    """`moebench profile` without --config takes the tables in use for moebench's kernel, as a sweep does (it
    took the heuristic, so a profile of a tabled point showed another config than the one benchmarked)."""
    from moebench.probes.profile import chosen_config

    write(tmp_path / "shipped", dtype="fp16", device=device_name())  # tiny's own shape: E=8, N=64
    problem = Problem(TINY, 4, "fp16")
    spec = SweepSpec("t", (Block((TINY,), (4,), ("fp16",), ("triton",)),))
    (point,) = validate(spec, Target.current()).points
    assert chosen_config(problem, "triton") == (AT_4, point.source) and point.tiles == (AT_4,)
    classic = get_path("triton-classic")
    assert chosen_config(problem, "triton-classic") == (classic.default_config(problem), "heuristic")
    assert chosen_config(problem, "torch") == (None, "")


def test_a_layer_behind_an_expert_map_is_not_fitted(tmp_path):
    """With expert_map the ids range over the global experts, which the fit's point (slots per local expert)
    does not describe: such a layer runs a table of its own or the heuristic sized for the global experts."""
    import torch

    from moebench.serve import api

    write(tmp_path / "mine", dtype="fp16", device=device_name(), n=128)
    x = torch.randn(4, 128).half()
    w13, w2 = torch.randn(4, 128, 128).half(), torch.randn(4, 128, 64).half()  # 4 local experts, I=64
    local_ids = torch.randint(0, 4, (4, 2))
    assert api.config_for(x, w13, w2, local_ids, configs_dir=tmp_path / "mine").source == "fitted"
    expert_map = torch.tensor([0, 1, 2, 3, -1, -1, -1, -1], dtype=torch.int32)  # 8 global experts
    global_ids = torch.randint(0, 8, (4, 2))
    got = api.config_for(x, w13, w2, global_ids, configs_dir=tmp_path / "mine", expert_map=expert_map)
    assert got.source == "heuristic"
