"""The result row: one schema (``rows.Row``), the columns every run folder's rows carry."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from moebench.bench.spec import Block, SweepSpec
from moebench.bench.sweep import run_sweep
from moebench.models import get_model
from moebench.paths.base import Target
from moebench.problem import Problem
from moebench.store.rows import Row
from moebench.store.runfolder import ROW_COLUMNS, ROWS_FILE, RunWriter, load_run
from moebench.tile import TileConfig

TINY = get_model("tiny")

# The columns of rows written before the schema was the Row type: rows on disk keep them, in this order.
COLUMNS = (
    "model", "experts", "hidden", "intermediate", "topk", "moe_layers", "M", "dtype", "path", "routing",
    "seed", "config", "status", "correct", "rel_err", "time_us", "time_p20_us", "time_p80_us", "reps",
    "floor_us", "bound", "pct_of_floor", "tflops", "gbps", "flops", "bytes", "experts_touched",
    "device_name", "interpreter", "timing_method", "error",
)
# Columns added after them, at the end, so older rows read as the same columns with these missing.
TUNING_COLUMNS = ("phase", "failure", "config_source")
EP_MAP_COLUMNS = ("global_experts",)  # sweep --ep-map's rows set it
ALL_COLUMNS = COLUMNS + TUNING_COLUMNS + EP_MAP_COLUMNS


def test_the_schema_is_the_row_type_and_keeps_its_columns():
    assert Row.columns() == ROW_COLUMNS == ALL_COLUMNS


def test_a_point_row_names_its_problem_and_nothing_measured():
    problem = Problem(TINY, 4, "fp16", seed=3)
    row = Row.for_point(problem, "triton", Target.current())
    assert list(row.as_dict()) == list(ALL_COLUMNS)
    assert (row.model, row.experts, row.hidden, row.intermediate, row.topk, row.M, row.seed) == (
        "tiny", 8, 128, 64, 2, 4, 3)
    assert row.flops == problem.flops and row.status == "ok" and row.time_us is None and row.error is None


def test_a_row_round_trips_through_its_file(tmp_path):
    """What the writer puts in rows.jsonl reads back as the same Row, and load_run gives its columns."""
    problem = Problem(TINY, 1, "fp16")
    row = replace(Row.for_point(problem, "triton", Target.current()), config=TileConfig(16, 32, 32).as_dict(),
                  correct=True, rel_err=1e-3, time_us=12.5, time_p20_us=12.0, time_p80_us=13.0, reps=20,
                  experts_touched=2, bytes=problem.min_bytes(2), timing_method="t")
    writer = RunWriter(tmp_path / "run", {"sweep": "t"})
    writer.append(row.as_dict())
    writer.finish()
    [line] = (tmp_path / "run" / ROWS_FILE).read_text().splitlines()
    assert list(json.loads(line)) == list(ALL_COLUMNS)
    assert Row(**json.loads(line)) == row
    _, df = load_run(tmp_path / "run")
    assert list(df.columns) == list(ALL_COLUMNS) and df["time_us"].item() == 12.5


def test_an_unknown_status_is_refused():
    with pytest.raises(ValueError, match="status"):
        replace(Row.for_point(Problem(TINY, 1, "fp16"), "torch", Target.current()), status="fine")


def test_the_runner_writes_exactly_the_schema(tmp_path):
    """A sweep's rows, a run and a refusal alike (bf16 triton on the interpreter), carry the schema's columns
    in its order."""
    spec = SweepSpec("t", (Block((TINY,), (1,), ("fp16", "bf16"), ("torch", "triton")),))
    seen = []
    run = run_sweep(spec, tmp_path, on_row=seen.append)
    lines = [json.loads(line) for line in (run / ROWS_FILE).read_text().splitlines()]
    assert [list(r) for r in lines] == [list(ALL_COLUMNS)] * len(lines) and len(lines) == 4
    assert [list(r) for r in seen] == [list(r) for r in lines]
    assert all(r["status"] in ("ok", "unsupported") for r in lines)
