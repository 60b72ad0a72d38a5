"""The executor: rows per point when tuning, typed rows for what cannot run, and run metadata."""

from __future__ import annotations

import pytest

from moebench._interpret import interpreting
from moebench.models import get_model
from moebench.problem import Problem
from moebench.results import load_run
from moebench.runner import run_sweep
from moebench.spec import Block, SweepSpec
from moebench.tuning import candidates


@pytest.mark.skipif(not interpreting(), reason="bf16 is refused only under the interpreter")
def test_tuned_sweep_writes_a_checked_row_per_candidate_and_one_row_per_refusal(tmp_path):
    """fp16 on the interpreter: one timed row per tile candidate; bf16 (refused there): one typed row."""
    tiny = get_model("tiny")
    spec = SweepSpec("t", (Block((tiny,), (1,), ("fp16", "bf16"), ("triton",)),), tune=True)
    seen = []
    meta, df = load_run(run_sweep(spec, tmp_path, on_row=seen.append))
    assert meta["tune"] is True and meta["status"] == "complete" and len(seen) == len(df)
    fp16 = df[df["dtype"] == "fp16"]
    assert len(fp16) == len(candidates(Problem(tiny, 1, "fp16")))
    assert (fp16["status"] == "ok").all() and fp16["correct"].all() and fp16["time_us"].notna().all()
    assert len({tuple(sorted(c.items())) for c in fp16["config"]}) == len(fp16)
    bf16 = df[df["dtype"] == "bf16"]
    assert len(bf16) == 1 and bf16["status"].item() == "unsupported" and "interpreter" in bf16["error"].item()
