"""Trace runs in the reports: kept apart from the benchmark rows, summarised in the cold-start table, charted
as compile events, and shown on the HTML page; built from hand-made trace folders (a GPU trace cannot run here)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from moebench.cli.report import print_tables
from moebench.errors import UserError
from moebench.report import runs
from moebench.report import tables as report
from moebench.report.charts import charts
from moebench.report.page import render_html
from moebench.report.trace_summary import requests_table, summarize

QUICK = Path(__file__).resolve().parent / "data" / "h200-quick"


def trace_folder(where: Path, compiles: list[int], *, specialize=False, interpreter=False) -> Path:
    """A trace run folder as `moebench trace` writes it: a request per entry of ``compiles``, each compile
    costing 300 ms over a 0.5 ms warm replay."""
    where.mkdir(parents=True)
    meta = {"schema_version": 1, "kind": "trace", "status": "complete", "model": "qwen3-30b-a3b", "dtype": "bf16",
            "device_name": "cpu (x86_64)" if interpreter else "NVIDIA H200", "interpreter": interpreter,
            "cache_mode": "cold", "specialize": specialize, "requests": len(compiles),
            "distribution": "lognormal(median=150, sigma=1.3) in 1..4096", "git_commit": "abc1234"}
    (where / "meta.json").write_text(json.dumps(meta))
    rows = [{"i": i, "M": 10 + i, "config": "16x64x128 w4 s4", "config_source": "heuristic",
             "latency_ms": 0.5 + 300 * c, "warm_ms": 0.5, "excess_ms": 300.0 * c,
             "compiles": None if interpreter else c, "compile_kernels": None if interpreter else ["_gemm1_swiglu"] * c,
             "compile_s": None if interpreter else [0.3] * c, "from_disk": None if interpreter else [False] * c,
             "new_cache_entries": None if interpreter else c}
            for i, c in enumerate(compiles)]
    (where / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return where


@pytest.fixture
def loaded(tmp_path):
    cold = trace_folder(tmp_path / "cold", [3, 2, 1] + [0] * 20 + [1] + [0] * 6)
    spec = trace_folder(tmp_path / "spec", [3, 1] * 15, specialize=True)
    return runs.load([QUICK, cold, spec])


def test_trace_rows_are_kept_apart_from_the_benchmark_rows(loaded):
    assert [r.kind for r in loaded.runs] == ["sweep", "trace", "trace"]
    assert len(loaded.rows) == 20 and set(loaded.rows["run"]) == {QUICK.name}
    assert [len(t.rows) for t in loaded.traces] == [30, 30]


def test_the_cold_start_table_is_each_traces_summary_and_says_what_it_includes(loaded):
    table = report.cold_start_table(loaded.traces)
    for trace, row in zip(loaded.traces, table.to_dict("records")):
        summary = summarize(trace.rows.to_dict("records"))
        assert row["variants_compiled"] == summary["variants_compiled"]
        assert row["compiles_after_20"] == summary["compiles_after_20"]
        assert row["total_excess_s"] == pytest.approx(summary["total_excess_s"])
    assert list(table["variants_compiled"]) == [7, 60] and list(table["compiles_after_20"]) == [1, 20]
    assert list(table["cache"]) == ["cold", "cold, specialized"]
    assert "once, not per layer" in table.attrs["caption"] and "excludes" in table.attrs["caption"]


def test_the_compiles_chart_draws_the_cumulative_compiles_of_each_trace(loaded):
    chart = {c.name: c for c in charts(loaded)}["compiles"]
    left, right = chart.figure.axes[:2]
    for trace, line in zip(loaded.traces, left.get_lines()):
        req = requests_table(trace.rows.to_dict("records"))
        assert list(line.get_ydata()) == list(req["compiles"].cumsum())
    assert "compiled" in left.get_ylabel() and "ms" in right.get_ylabel()
    assert {"time", "floor", "ttft"} <= {c.name for c in charts(loaded)}  # the sweep's charts as before


def test_an_interpreter_trace_has_no_compile_chart_and_says_it_counted_nothing(tmp_path):
    loaded = runs.load([trace_folder(tmp_path / "cpu", [0, 0, 0], interpreter=True)])
    assert "compiles" not in {c.name for c in charts(loaded)}
    table = report.cold_start_table(loaded.traces)
    assert table["variants_compiled"].isna().all() and "compiles nothing" in table.attrs["caption"]


def test_the_page_shows_the_cold_start_table_and_the_chart(loaded):
    page = render_html(loaded)
    assert "Cold start of the MoE kernels" in page and "once, not per layer" in page
    assert page.count("data:image/png;base64,") == len(charts(loaded))


def test_report_cli_prints_the_cold_start_table_and_refuses_it_without_a_trace(loaded, capsys):


    print_tables(loaded.rows, "csv", Console(), "cold_start", loaded.traces)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("model,dtype,cache,requests") and len(lines) == 3
    with pytest.raises(UserError, match="trace"):
        print_tables(loaded.rows, "csv", Console(), "cold_start", [])
    assert isinstance(pd.read_csv(__import__("io").StringIO("\n".join(lines))), pd.DataFrame)
