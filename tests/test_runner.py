"""The executor: a tuned sweep's points run with their tune's choices, typed rows for what cannot run, one
pipeline per point, and run metadata."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from moebench._interpret import interpreting
from moebench.bench.spec import Block, SweepSpec
from moebench.bench.sweep import run_sweep
from moebench.measure.timer import WALLCLOCK, Timing
from moebench.models import get_model
from moebench.paths.base import Target
from moebench.problem import Problem, make_inputs
from moebench.store.runfolder import load_run
from moebench.tile import TileConfig
from moebench.tune.strategies.fast import INTERPRETER

CHOICE, DEFAULT, KNOWN = (TileConfig(16, 32, 32, 1, 4, 2), TileConfig(16, 64, 32, 1, 4, 2),
                          TileConfig(32, 32, 32, 1, 4, 2))  # what the stand-in tune's best.json holds


def once(fn) -> Timing:
    """The interpreter's wall-clock timing of a single run, not a warm-up and three: each row still gets a time."""
    start = time.perf_counter()
    fn()
    return Timing.from_samples([(time.perf_counter() - start) * 1e6], WALLCLOCK)


@pytest.fixture
def stand_in_tune(monkeypatch):
    """``tune.run.tune`` replaced: it records each request and writes a finished tune's folder whose best.json
    times, back to back, the choice (10 us), the default (12) and a known seed (9 at odd M, 11 at even M)."""
    from moebench.store.runfolder import META_FILE
    from moebench.tune import run

    asked = []

    def tune(request, out_base, **_):
        asked.append(request)
        folder = Path(out_base) / f"tune-{len(asked)}"
        folder.mkdir(parents=True)
        (folder / META_FILE).write_text(json.dumps({"request": request.key, "status": "complete"}))
        configs = {str(m): {"config": CHOICE.as_dict(), "time_us": 10.0, "default": DEFAULT.as_dict(),
                            "default_us": 12.0, "known": KNOWN.as_dict(), "known_us": 9.0 if m % 2 else 11.0}
                   for m in request.ms}
        (folder / run.BEST_FILE).write_text(json.dumps({"configs": configs}))
        return SimpleNamespace(run_dir=folder)

    monkeypatch.setattr(run, "tune", tune)
    return asked


@pytest.mark.skipif(not interpreting(), reason="bf16 is refused only under the interpreter")
def test_a_tuned_sweep_runs_each_point_once_with_the_fastest_its_tune_timed(tmp_path, monkeypatch, stand_in_tune):
    """The tune is asked once per (path, shape, dtype) the path can run, over the sweep's M; each point then
    runs one checked, timed row with the fastest of the tune's choice, default and known seed (the known seed
    at M=1, the choice at M=2); bf16, refused on the interpreter, gets one typed row and no tune. A second start
    reads the finished tune instead of tuning again. On the interpreter the tune's search is the short one."""
    import moebench.measure.point as point

    monkeypatch.setattr(point, "time_wallclock", once)
    tiny = get_model("tiny")
    spec = SweepSpec("t", (Block((tiny,), (1, 2), ("fp16", "bf16"), ("triton",)),), tune=True)
    meta, df = load_run(run_sweep(spec, tmp_path / "out"))
    (request,) = stand_in_tune
    assert (request.path, request.shape, request.dtype, request.ms) == ("triton", tiny, "fp16", (1, 2))
    assert request.options == INTERPRETER  # the interpreter's short search
    assert meta["tune"] is True and meta["tune_runs"] == ["tune-1"] and meta["status"] == "complete"
    fp16 = df[df["dtype"] == "fp16"].set_index("M")
    assert [TileConfig.from_dict(fp16.loc[m, "config"]) for m in (1, 2)] == [KNOWN, CHOICE]
    assert (fp16["config_source"] == "tuned").all() and fp16["correct"].all() and fp16["time_us"].notna().all()
    bf16 = df[df["dtype"] == "bf16"]
    assert len(bf16) == 2 and (bf16["status"] == "unsupported").all()
    again, _ = load_run(run_sweep(spec, tmp_path / "out", resume=False))
    assert len(stand_in_tune) == 1 and again["tune_runs"] == ["tune-1"]


def test_pinned_configs_replace_the_tunes_choice_at_the_points_they_name(tmp_path, monkeypatch, stand_in_tune):
    """A config pinned for (model, dtype, M) is that point's one row, tuning or not, and its M is not tuned;
    the other points run the tune's choice."""
    import moebench.measure.point as point

    monkeypatch.setattr(point, "time_wallclock", once)
    tiny = get_model("tiny")
    pinned = TileConfig(16, 32, 32, 1, 4, 2, swap_ab=True, atomic_sum=False)
    spec = SweepSpec("t", (Block((tiny,), (1, 3), ("fp16",), ("triton",)),), tune=True)
    _, df = load_run(run_sweep(spec, tmp_path, configs={(tiny.name, "fp16", 3): pinned}))
    assert [r.ms for r in stand_in_tune] == [(1,)]
    at3, at1 = df[df["M"] == 3], df[df["M"] == 1]
    assert TileConfig.from_dict(at3["config"].item()) == pinned and at3["config_source"].item() == "pinned"
    assert at3["correct"].all() and TileConfig.from_dict(at1["config"].item()) == KNOWN


@pytest.mark.skipif(interpreting() or not torch.cuda.is_available(), reason="tunes on a GPU")
def test_a_tuned_sweep_on_a_gpu_runs_the_tunes_search(tmp_path):
    """On a GPU the tune is the real one: its folder is beside the sweep's and each row runs its table's config."""
    tiny = get_model("tiny")
    spec = SweepSpec("t", (Block((tiny,), (1, 16), ("fp16",), ("triton",)),), tune=True)
    meta, df = load_run(run_sweep(spec, tmp_path, compile_jobs=2))
    (tune_dir,) = [tmp_path / name for name in meta["tune_runs"]]
    best = json.loads((tune_dir / "best.json").read_text())
    assert set(best["configs"]) == {"1", "16"} and (df["status"] == "ok").all() and len(df) == 2


class CountingPath:
    """A tunable path that runs the float32 reference (wrong, all zeros, with Swap-AB) and counts what the runner
    asks of it: ``supports`` calls, ``prepare`` calls per config, and calls of each prepared closure."""

    name = "counting"
    baseline = False
    tunable = True
    graph_safe = False  # the reference synchronizes with the host

    def __init__(self) -> None:
        self.supports_calls: list[tuple] = []
        self.prepared: list[tuple[TileConfig, list]] = []  # (config, one entry per call of its closure)

    def supports(self, problem, target):
        self.supports_calls.append((problem, target))
        return None

    def default_config(self, problem):
        return TileConfig(16, 32, 32)

    def prepare(self, inputs, problem, config):
        from moebench.paths.torch_ref import moe_reference

        calls: list = []
        self.prepared.append((config, calls))

        def run(out):
            calls.append(out.data_ptr())
            if config.swap_ab:
                out.zero_()
            else:
                out.copy_(moe_reference(inputs.x, inputs.weights, inputs.topk_weights, inputs.topk_ids))

        return run


@pytest.fixture
def counting(monkeypatch):
    from moebench.paths import registry

    path = CountingPath()
    monkeypatch.setitem(registry.PATHS, path.name, path)
    return path


def test_one_pipeline_per_point_support_once_prepare_once_per_config_one_closure(tmp_path, counting):
    """Support is decided once per (point, path); each config of a point is prepared once, and that one closure
    is checked and then, only where correct, timed (the Swap-AB config here writes zeros: checked, not timed)."""
    from moebench.bench.sweep import validate

    tiny = get_model("tiny")
    spec = SweepSpec("t", (Block((tiny,), (1, 2), ("fp16",), ("counting",)),))
    plan = validate(spec, Target.current())
    assert len(counting.supports_calls) == 2  # one per point
    two = (TileConfig(16, 32, 32), TileConfig(16, 32, 32, swap_ab=True, atomic_sum=False))
    plan = replace(plan, points=tuple(replace(p, tiles=two) for p in plan.points))
    meta, df = load_run(run_sweep(plan, tmp_path))
    assert len(counting.supports_calls) == 2  # the run used the plan's decisions
    assert len(df) == len(counting.prepared) == 4 == plan.rows
    for config, calls in counting.prepared:
        assert len(set(calls)) == 1  # the check and the timing wrote one output tensor
        assert len(calls) == 1 if config.swap_ab else len(calls) > 1
    swapped = df["config"].map(lambda c: c["swap_ab"])
    assert (df.loc[swapped, "status"] == "incorrect").all() and df.loc[swapped, "time_us"].isna().all()
    assert (df.loc[~swapped, "status"] == "ok").all() and df.loc[~swapped, "correct"].all()


def test_the_check_and_the_timing_share_the_inputs_the_row_describes(tmp_path, counting):
    """The experts a row says were touched are those of the inputs its config was checked on: one draw per M."""
    tiny = get_model("tiny")
    spec = SweepSpec("t", (Block((tiny,), (1,), ("fp16",), ("counting",)),))
    _, df = load_run(run_sweep(spec, tmp_path))
    inputs = make_inputs(Problem(tiny, 1, "fp16"), "cpu" if not torch.cuda.is_available() else "cuda")
    assert df["experts_touched"].item() == inputs.experts_touched and df["status"].item() == "ok"


def test_a_plan_refuses_a_path_that_runs_nothing_here(monkeypatch):
    """The refusal comes from the plan's own support decisions, before anything is written."""
    from moebench.bench.sweep import SweepPlan
    from moebench.errors import UserError
    from moebench.paths import registry

    class Never(CountingPath):
        def supports(self, problem, target):
            return "never here"

    spec = SweepSpec("t", (Block((get_model("tiny"),), (1,), ("fp16",), ("torch",)),))
    plan = SweepPlan.build(spec, Target.current())
    assert [p.reason for p in plan.points] == [None] and plan.rows == 1
    never = Never()
    never.name = "never"
    monkeypatch.setitem(registry.PATHS, never.name, never)
    with pytest.raises(UserError, match="'never' cannot run any point.*never here"):
        SweepPlan.build(SweepSpec("t", (Block((get_model("tiny"),), (1,), ("fp16",), ("torch", "never")),)),
                        Target.current())
