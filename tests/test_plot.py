"""Charts of runs: which appear for which rows, that they plot the report's tables, their labels and files."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pytest
from matplotlib.text import Text

from moebench.errors import UserError
from moebench.report import charts as plot
from moebench.report import runs
from moebench.report import tables as report
from moebench.store.rows import Row
from moebench.store.runfolder import RunWriter

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "tests" / "data" / "h200-kernels"  # 3 models, bf16/fp8, triton and cutlass, 7 M (H200)
TUNE = ROOT / "tests" / "data" / "h200-tune-fast"  # best.json and meta.json of two tunes, side by side
TIMING = "cuda-graph replay, L2 emptied before each replay (a read of 4x its size so that nothing stays), median"
CEILINGS = {"read_gbps": 4600.0, "bf16_tflops": 790.0, "fp8_tflops": 1430.0}
MIXTRAL = {"model": "mixtral-8x7b", "experts": 8, "hidden": 4096, "intermediate": 14336, "topk": 2,
           "moe_layers": 32}
QWEN = {"model": "qwen3-30b-a3b", "experts": 128, "hidden": 2048, "intermediate": 768, "topk": 8, "moe_layers": 48}


def row(shape: dict = MIXTRAL, M: int = 16, path: str = "triton", dtype: str = "bf16", **over) -> dict:
    """A GPU row; its time grows with M and differs per path and dtype, so each series is distinct."""
    time_us = M * 3.0 + {"triton": 10.0, "cutlass": 25.0, "torch": 60.0}[path] + (5.0 if dtype == "bf16" else 0.0)
    gpu = {"time_us": time_us, "floor_us": time_us / 2, "pct_of_floor": 50.0 + M % 7, "device_name": "NVIDIA H200"}
    config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}
    r = Row(**shape, M=M, dtype=dtype, path=path, routing="uniform", seed=0,
            config=config if path == "triton" else None, correct=True, rel_err=1e-3).as_dict()
    return {**r, **gpu, **over}


def cpu_row(M: int, path: str, rel_err: float, correct: bool = True) -> dict:
    r = Row(model="tiny", experts=8, hidden=128, intermediate=256, topk=2, moe_layers=2, M=M, dtype="fp16",
            path=path, routing="uniform", seed=0, status="ok" if correct else "incorrect", correct=correct,
            rel_err=rel_err, time_us=5000.0 + M, device_name="cpu (x86_64)", interpreter=True)
    return r.as_dict()


def make_run(folder: Path, rows: list[dict], **meta) -> Path:
    """A run folder written the way a sweep writes one."""
    interp = bool(rows) and all(r["interpreter"] for r in rows)
    base = {"device_name": "cpu (x86_64)" if interp else "NVIDIA H200", "interpreter": interp,
            "torch": "2.11.0", "triton": "3.6.0", "timing_method": "interpreter wall clock" if interp else TIMING}
    if not interp:
        base["ceilings"] = CEILINGS
    writer = RunWriter(folder, {**base, **meta})
    for r in rows:
        writer.append(r)
    writer.finish()
    return folder


def make_tune(folder: Path, stem: str = "qwen3-30b-a3b-bf16") -> Path:
    """A tune's run folder from a committed tune's best.json and meta.json (no rows)."""
    folder.mkdir(parents=True)
    shutil.copy(TUNE / f"{stem}.best.json", folder / plot.BEST_FILE)
    shutil.copy(TUNE / f"{stem}.meta.json", folder / "meta.json")
    (folder / "rows.jsonl").write_text("")
    return folder


def gpu_rows(ms=(1, 16, 256, 1024)) -> list[dict]:
    """Two models, triton and cutlass, bf16 and fp8: every GPU chart has data (M >= 128 for the TTFT)."""
    return [row(shape, M, path, dtype) for shape in (MIXTRAL, QWEN) for M in ms
            for path in ("triton", "cutlass") for dtype in ("bf16", "fp8-tensor")]


def names(r: runs.Runs) -> list[str]:
    return [c.name for c in plot.charts(r)]


def by_name(r: runs.Runs) -> dict[str, plot.Chart]:
    return {c.name: c for c in plot.charts(r)}


def panel(chart: plot.Chart, title: str):
    (ax,) = [a for a in chart.figure.findobj(lambda o: hasattr(o, "get_title") and hasattr(o, "get_lines"))
             if a.get_title() == title]
    return ax


def line(ax, label: str):
    (found,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return found


def texts(chart: plot.Chart) -> str:
    return "\n".join(t.get_text() for t in chart.figure.findobj(Text))


@pytest.fixture(scope="module")
def kernels() -> runs.Runs:
    return runs.load([KERNELS])


# ---- which charts ----------------------------------------------------------------------------------------

def test_each_chart_appears_exactly_when_its_data_exists(tmp_path):
    full = make_run(tmp_path / "full", gpu_rows())
    assert names(runs.load([full])) == ["time", "floor", "gains", "ttft"]
    # no triton rows: no gains; no M >= 128: no TTFT; no floor computed: no floor chart
    torch_only = make_run(tmp_path / "torch", [row(M=M, path="torch", pct_of_floor=None) for M in (1, 16)])
    assert names(runs.load([torch_only])) == ["time"]
    # interpreter rows: their check, and no timing chart at all
    cpu = make_run(tmp_path / "cpu", [cpu_row(M, p, e) for M in (1, 16) for p, e in (("torch", 0.0), ("triton", 3e-4))])
    assert names(runs.load([cpu])) == ["check"]
    tune = make_tune(tmp_path / "tune")
    assert names(runs.load([tune])) == ["tuned"]
    assert names(runs.load([full, cpu, tune])) == ["time", "floor", "gains", "tuned", "ttft", "check"]


def test_a_tune_without_best_json_has_no_tuned_chart(tmp_path):
    folder = make_run(tmp_path / "tune", [row(M=16)], tune=True)  # stopped before it chose anything
    assert "tuned" not in names(runs.load([folder]))
    assert plot.tuned_table(runs.load([folder])).empty


def test_nothing_to_draw_is_a_user_error_and_writes_nothing(tmp_path):
    failed = make_run(tmp_path / "failed", [row(M=M, status="error", time_us=None, pct_of_floor=None,
                                                error="RuntimeError: out of resources") for M in (1, 16)])
    assert plot.charts(runs.load([failed])) == []
    with pytest.raises(UserError, match="nothing to chart"):
        plot.write_charts(runs.load([failed]), tmp_path / "png")
    assert not (tmp_path / "png").exists()


# ---- the values are the tables' values --------------------------------------------------------------------

@pytest.mark.parametrize("name, column", [("time", "time_us"), ("floor", "pct_of_floor")])
def test_time_and_floor_plot_the_throughput_table(kernels, name, column):
    chart = by_name(kernels)[name]
    table = report.throughput_table(kernels.rows)
    series = table.groupby(["model", "path", "dtype"])
    assert len(series) > 4  # the case covers several models, paths and dtypes
    for (model, path, dtype), g in series:
        ln = line(panel(chart, model), f"{path}, {dtype}")
        g = g.sort_values("M")
        assert list(ln.get_xdata()) == list(g["M"])
        assert list(ln.get_ydata()) == pytest.approx(list(g[column]))


def test_gains_plot_the_gains_table_with_a_line_at_one(kernels):
    chart = by_name(kernels)["gains"]
    gains = report.gains_table(kernels.rows)
    checked = 0
    for prefix, column in (("triton vs cutlass", "vs_cutlass"), ("fp8 vs bf16", "fp8_gain")):
        for (model, dtype), g in gains[gains[column].notna()].groupby(["model", "dtype"]):
            ax = panel(chart, model)
            (ln,) = [x for x in ax.get_lines() if x.get_label().startswith(prefix) and x.get_label().endswith(dtype)]
            assert list(ln.get_xdata()) == list(g.sort_values("M")["M"])
            assert list(ln.get_ydata()) == pytest.approx(list(g.sort_values("M")[column]))
            assert any(list(x.get_ydata()) == [1.0, 1.0] and x.get_linestyle() == "--" for x in ax.get_lines())
            checked += 1
    assert checked >= 4
    labels = [x.get_label() for ax in chart.figure.findobj(lambda o: hasattr(o, "get_lines")) for x in ax.get_lines()]
    assert not any(lb.startswith("Swap-AB") for lb in labels)  # no swap rows in this run: that gain is left out
    assert "deepseek-v3@tp8" not in [a.get_title() for a in chart.figure.findobj(lambda o: hasattr(o, "get_title"))]


def test_ttft_plots_the_prefill_ttft_table(kernels):
    chart = by_name(kernels)["ttft"]
    table = report.prefill_ttft_table(kernels.rows)
    assert not table.empty
    for (model, path, dtype), g in table.groupby(["model", "path", "dtype"]):
        ln = line(panel(chart, model), f"{path}, {dtype}")
        assert list(ln.get_xdata()) == list(g["prompt_len"])
        assert list(ln.get_ydata()) == pytest.approx(list(g["moe_ttft_ms"]))


def test_tuned_table_reads_best_json_and_the_chart_plots_it(tmp_path):
    folders = [make_tune(tmp_path / "a"), make_tune(tmp_path / "b", "deepseek-v3-tp8-fp8-block128")]
    loaded = runs.load(folders)
    table = plot.tuned_table(loaded)
    assert list(table.columns) == plot.TUNED_COLUMNS
    for folder in folders:
        best = json.loads((folder / plot.BEST_FILE).read_text())
        mine = table[table["run"] == folder.name]
        assert sorted(mine["M"]) == sorted(int(m) for m in best["configs"])
        for m, v in best["configs"].items():
            r = mine[mine["M"] == int(m)].iloc[0]
            assert (r["model"], r["dtype"], r["kernel"]) == (best["model"], best["dtype"], best["kernel"])
            assert r["speedup"] == pytest.approx(v["default_us"] / v["time_us"])
    ax = panel(by_name(loaded)["tuned"], "")
    for folder in folders:
        mine = table[table["run"] == folder.name]
        r = mine.iloc[0]
        ln = line(ax, f"{r['model']}, {r['dtype']}, {r['kernel']}")
        assert list(ln.get_ydata()) == pytest.approx(list(mine["speedup"]))


def test_tuned_table_leaves_a_point_without_times_as_nan(tmp_path):
    folder = make_tune(tmp_path / "t")
    best = json.loads((folder / plot.BEST_FILE).read_text())
    first = next(iter(best["configs"]))
    best["configs"][first].update(time_us=None)  # the chosen config failed when re-timed
    (folder / plot.BEST_FILE).write_text(json.dumps(best))
    table = plot.tuned_table(runs.load([folder]))
    assert math.isnan(table.loc[table["M"] == int(first), "speedup"].iloc[0])
    assert table["speedup"].notna().sum() == len(best["configs"]) - 1


def test_check_marks_the_points_that_failed(tmp_path):
    rows = [cpu_row(1, "torch", 0.0), cpu_row(16, "torch", 0.0), cpu_row(1, "triton", 3e-4),
            cpu_row(16, "triton", 0.2, correct=False)]
    loaded = runs.load([make_run(tmp_path / "cpu", rows)])
    chart = by_name(loaded)["check"]
    table = report.throughput_table(loaded.rows)
    ax = panel(chart, "tiny")
    for path, g in table.groupby("path"):
        ln = line(ax, f"{path}, fp16")
        assert list(ln.get_ydata()) == pytest.approx(list(g.sort_values("M")["rel_err"]))
    failed = line(ax, "check failed")
    assert (list(failed.get_xdata()), list(failed.get_ydata())) == ([16], [0.2])
    assert "1 of 4 points fail" in chart.title


# ---- what a reader sees ------------------------------------------------------------------------------------

UNITS = {"time": ("µs", "tokens"), "floor": ("%", "tokens"), "gains": ("×", "tokens"),
         "tuned": ("×", "tokens"), "ttft": ("ms", "tokens"), "check": ("‖ref‖", "tokens")}


def test_every_chart_has_units_a_title_a_legend_and_the_machine_in_its_caption(tmp_path):
    loaded = runs.load([make_run(tmp_path / "gpu", gpu_rows()), make_tune(tmp_path / "tune"),
                        make_run(tmp_path / "cpu", [cpu_row(1, "triton", 3e-4)])])
    made = plot.charts(loaded)
    assert {c.name for c in made} == set(UNITS)
    for chart in made:
        y_unit, x_unit = UNITS[chart.name]
        axes = chart.figure.findobj(lambda o: hasattr(o, "get_ylabel") and hasattr(o, "get_lines"))
        assert axes and all(y_unit in a.get_ylabel() and x_unit in a.get_xlabel() for a in axes), chart.name
        words = texts(chart)
        assert chart.title in words and "\n" not in chart.title
        assert chart.figure.findobj(lambda o: type(o).__name__ == "Legend"), chart.name
        if chart.name == "check":
            assert "cpu (x86_64)" in words and "timing:" not in words
        else:
            assert "NVIDIA H200" in words and "timing:" in words


def test_the_caption_carries_the_runs_ceilings_and_a_shortened_timing_method(kernels, tmp_path):
    words = texts(by_name(kernels)["time"])
    ceilings = kernels.runs[0].meta["ceilings"]
    assert f"{ceilings['read_gbps'] / 1000:.2f} TB/s" in words and f"{ceilings['fp8_tflops']:.0f} TFLOP/s" in words
    long = runs.load([make_run(tmp_path / "r", gpu_rows((1, 16))[:4])])
    words = texts(by_name(long)["time"])
    assert "timing: cuda-graph replay, L2 emptied before each replay, median" in words  # parentheses dropped
    assert "a read of 4x" not in words


def test_x_ticks_sit_at_the_measured_m_with_the_ends_labelled(kernels):
    ax = panel(by_name(kernels)["time"], "mixtral-8x7b")
    measured = sorted(int(m) for m in kernels.rows["M"].unique())
    assert [int(t) for t in ax.get_xticks()] == measured
    fmt = ax.xaxis.get_major_formatter()
    assert fmt(measured[0], 0) == str(measured[0]) and fmt(measured[-1], 0) == str(measured[-1])


# ---- files -------------------------------------------------------------------------------------------------

def test_write_charts_writes_a_png_per_chart_and_no_temp_file(tmp_path):
    loaded = runs.load([make_run(tmp_path / "gpu", gpu_rows((1, 256)))])
    out = tmp_path / "png" / "deeper"
    written = plot.write_charts(loaded, out)
    assert [p.name for p in written] == [f"{c.name}.png" for c in plot.charts(loaded)]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)  # nothing else left behind
    for p in written:
        assert p.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_png_bytes_follow_the_dpi(kernels):
    chart = by_name(kernels)["floor"]
    width = {dpi: struct.unpack(">I", plot.png_bytes(chart, dpi=dpi)[16:20])[0] for dpi in (50, 100)}
    assert width[100] == pytest.approx(2 * width[50], abs=2)


def test_a_best_json_that_is_not_a_tunes_is_a_user_error_naming_it(tmp_path):
    folder = make_tune(tmp_path / "t")
    (folder / plot.BEST_FILE).write_text('{"configs": {"one": {}}}')  # an M that is no number
    with pytest.raises(UserError, match="best.json"):
        plot.tuned_table(runs.load([folder]))


def test_the_compiles_caption_counts_the_requests_replayed_not_those_asked_for(tmp_path):
    """A trace stopped after 5 of its 1000 requests: the caption says 5 of 1000 replayed; a whole one, 1000."""
    import gzip

    cold = ROOT / "results" / "h200-trace-03dae1f" / "cold"
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    shutil.copy(cold / "meta.json", stopped / "meta.json")
    first = gzip.decompress((cold / "rows.jsonl.gz").read_bytes()).decode().splitlines(keepends=True)[:5]
    (stopped / "rows.jsonl").write_text("".join(first))
    assert json.loads((stopped / "meta.json").read_text())["requests"] == 1000  # the precondition
    caption = texts(by_name(runs.load([stopped]))["compiles"])
    assert "5 of 1000 requests replayed" in caption
    assert ": 1000 requests, " in texts(by_name(runs.load([cold]))["compiles"])
