"""The executor: rows per point when tuning, typed rows for what cannot run, and run metadata."""

from __future__ import annotations

import pytest
import torch

from moebench._interpret import interpreting
from moebench.models import get_model
from moebench.problem import Problem
from moebench.results import load_run
from moebench.runner import run_sweep
from moebench.spec import Block, SweepSpec
from moebench.tile import TileConfig
from moebench.tuning import candidates


@pytest.mark.skipif(not interpreting(), reason="bf16 is refused only under the interpreter")
def test_tuned_sweep_writes_a_checked_row_per_candidate_and_one_row_per_refusal(tmp_path):
    """fp16 on the interpreter: one timed row per tile candidate; bf16 (refused there): one typed row. The
    interpreter compiles nothing, so compile workers asked for are not started."""
    tiny = get_model("tiny")
    spec = SweepSpec("t", (Block((tiny,), (1,), ("fp16", "bf16"), ("triton",)),), tune=True)
    seen = []
    meta, df = load_run(run_sweep(spec, tmp_path, on_row=seen.append, compile_jobs=2))
    assert meta["tune"] is True and meta["status"] == "complete" and len(seen) == len(df)
    assert meta["compile_jobs"] == 0
    fp16 = df[df["dtype"] == "fp16"]
    assert len(fp16) == len(candidates(Problem(tiny, 1, "fp16")))
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


def test_pinned_configs_replace_the_candidates_at_the_points_they_name(tmp_path):
    """A config pinned for (model, dtype, M) is the one row of that point, tuning or not; other points keep
    the tuner's candidates."""
    tiny = get_model("tiny")
    pinned = TileConfig(16, 32, 32, 1, 4, 2, swap_ab=True, atomic_sum=False)
    spec = SweepSpec("t", (Block((tiny,), (1, 3), ("fp16",), ("triton",)),), tune=True)
    _, df = load_run(run_sweep(spec, tmp_path, configs={(tiny.name, "fp16", 3): pinned}))
    at3, at1 = df[df["M"] == 3], df[df["M"] == 1]
    assert len(at3) == 1 and TileConfig.from_dict(at3["config"].item()) == pinned
    assert (at3["status"] == "ok").all() and at3["correct"].all()
    assert len(at1) == len(candidates(Problem(tiny, 1, "fp16")))
