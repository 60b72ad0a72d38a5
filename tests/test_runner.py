"""The executor: rows per point when tuning, typed rows for what cannot run, and run metadata."""

from __future__ import annotations

import time

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
from moebench.tune.handpicked import candidates


@pytest.mark.skipif(not interpreting(), reason="bf16 is refused only under the interpreter")
def once(fn) -> Timing:
    """The interpreter's wall-clock timing of a single run, not a warm-up and three: each row still gets a time."""
    start = time.perf_counter()
    fn()
    return Timing.from_samples([(time.perf_counter() - start) * 1e6], WALLCLOCK)


def one_per_variant(problem: Problem) -> list[TileConfig]:
    """The tuner's candidates, one per variant (the label past tile shape, warps and stages), each variant at the
    next tile shape in turn: every variant and every tile shape of the candidates, a quarter of the runs."""
    by_variant: dict[str, list[TileConfig]] = {}
    for c in candidates(problem):
        by_variant.setdefault(" ".join(c.label.split()[3:]), []).append(c)
    return [cs[i % len(cs)] for i, cs in enumerate(by_variant.values())]


def test_tuned_sweep_writes_a_checked_row_per_candidate_and_one_row_per_refusal(tmp_path, monkeypatch):
    """fp16 on the interpreter: one timed row per tile candidate (the tuner's, one per variant: each variant
    and each tile shape still checked against the reference); bf16 (refused there): one typed row. The
    interpreter compiles nothing, so compile workers asked for are not started."""
    import moebench.bench.sweep as runner
    import moebench.measure.point as point

    tiny = get_model("tiny")
    every, picked = candidates(Problem(tiny, 1, "fp16")), one_per_variant(Problem(tiny, 1, "fp16"))
    shapes = {c.label.split()[0] for c in every}
    assert len(shapes) > 1 and {c.label.split()[0] for c in picked} == shapes  # every tile shape runs
    assert {" ".join(c.label.split()[3:]) for c in picked} == {" ".join(c.label.split()[3:]) for c in every}
    monkeypatch.setattr(runner, "candidates", one_per_variant)
    monkeypatch.setattr(point, "time_wallclock", once)
    spec = SweepSpec("t", (Block((tiny,), (1,), ("fp16", "bf16"), ("triton",)),), tune=True)
    seen = []
    meta, df = load_run(run_sweep(spec, tmp_path, on_row=seen.append, compile_jobs=2))
    assert meta["tune"] is True and meta["status"] == "complete" and len(seen) == len(df)
    assert meta["compile_jobs"] == 0
    fp16 = df[df["dtype"] == "fp16"]
    assert len(fp16) == len(picked) and [TileConfig.from_dict(c) for c in fp16["config"]] == picked
    assert (fp16["status"] == "ok").all() and fp16["correct"].all() and fp16["time_us"].notna().all()
    assert len({tuple(sorted(c.items())) for c in fp16["config"]}) == len(fp16)
    bf16 = df[df["dtype"] == "bf16"]
    assert len(bf16) == 1 and bf16["status"].item() == "unsupported" and "interpreter" in bf16["error"].item()


@pytest.mark.skipif(interpreting() or not torch.cuda.is_available(), reason="compiles for a GPU")
def test_a_tuned_sweep_on_a_gpu_compiles_its_candidates_in_workers(tmp_path):
    """Asked for two compile workers, a tuned GPU sweep uses them (the pool never stopped) and still checks
    and times every candidate."""
    tiny = get_model("tiny")
    spec = SweepSpec("t", (Block((tiny,), (1,), ("fp16",), ("triton",)),), tune=True)
    meta, df = load_run(run_sweep(spec, tmp_path, compile_jobs=2))
    assert meta["compile_jobs"] == 2 and "compile_jobs_stopped" not in meta
    assert len(df) == len(candidates(Problem(tiny, 1, "fp16"))) and (df["status"] == "ok").all()


def test_pinned_configs_replace_the_candidates_at_the_points_they_name(tmp_path, monkeypatch):
    """A config pinned for (model, dtype, M) is the one row of that point, tuning or not; other points keep
    the tuner's candidates (here its first three, so the interpreter runs a few: the tuned-sweep test above
    runs one per variant)."""
    import moebench.bench.sweep as runner
    import moebench.measure.point as point

    monkeypatch.setattr(runner, "candidates", lambda problem: candidates(problem)[:3])
    monkeypatch.setattr(point, "time_wallclock", once)
    tiny = get_model("tiny")
    pinned = TileConfig(16, 32, 32, 1, 4, 2, swap_ab=True, atomic_sum=False)
    spec = SweepSpec("t", (Block((tiny,), (1, 3), ("fp16",), ("triton",)),), tune=True)
    _, df = load_run(run_sweep(spec, tmp_path, configs={(tiny.name, "fp16", 3): pinned}))
    at3, at1 = df[df["M"] == 3], df[df["M"] == 1]
    assert len(at3) == 1 and TileConfig.from_dict(at3["config"].item()) == pinned
    assert (at3["status"] == "ok").all() and at3["correct"].all()
    assert [TileConfig.from_dict(c) for c in at1["config"]] == candidates(Problem(tiny, 1, "fp16"))[:3]


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
    """Support is decided once per (point, path); each candidate is prepared once, and that one closure is
    checked and then, only where correct, timed (a Swap-AB candidate here writes zeros: checked, not timed)."""
    from moebench.bench.sweep import validate

    tiny = get_model("tiny")
    spec = SweepSpec("t", (Block((tiny,), (1, 2), ("fp16",), ("counting",)),), tune=True)
    plan = validate(spec, Target.current())
    assert len(counting.supports_calls) == 2  # one per point
    meta, df = load_run(run_sweep(plan, tmp_path))
    assert len(counting.supports_calls) == 2  # the run used the plan's decisions
    n = len(candidates(Problem(tiny, 1, "fp16"))) + len(candidates(Problem(tiny, 2, "fp16")))
    assert len(df) == len(counting.prepared) == n == plan.rows
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
