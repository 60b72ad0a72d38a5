"""Throughput / TTFT tables and their rendering as rich table, CSV and JSON."""

from __future__ import annotations

import io
import json
import math

import pandas as pd
import pytest
from rich.console import Console

from moebench.errors import UserError
from moebench.report.tables import (
    INTERPRETER_CAPTION,
    THROUGHPUT_COLUMNS,
    TTFT_COLUMNS,
    TTFT_NOTE,
    format_cell,
    interpreter_caption,
    render,
    throughput_table,
    ttft_table,
)

TILE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}
MIXTRAL = {
    "model": "mixtral-8x7b", "experts": 8, "hidden": 4096, "intermediate": 14336, "topk": 2, "moe_layers": 32,
}
QWEN = {
    "model": "qwen3-30b-a3b", "experts": 128, "hidden": 2048, "intermediate": 768, "topk": 8,
    "moe_layers": 48,
}


def row(shape: dict = MIXTRAL, **over) -> dict:
    r = {
        **shape, "M": 1, "dtype": "bf16", "path": "triton", "routing": "uniform", "config": dict(TILE),
        "status": "ok", "correct": True, "rel_err": 1e-3, "time_us": 100.0, "time_p20_us": 99.0,
        "time_p80_us": 101.0, "floor_us": 50.0, "pct_of_floor": 50.0, "tflops": 1.5, "gbps": 2500.0,
        "device_name": "NVIDIA H200", "interpreter": False,
    }
    r.update(over)
    if r["path"] != "triton":
        r["config"] = None
    return r


def frame(*rows: dict) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


def sample() -> pd.DataFrame:
    return frame(
        row(M=1, time_us=80.0),
        row(M=1, path="torch", time_us=400.0),
        row(M=512, time_us=900.0),
        row(M=4096, time_us=5000.0, pct_of_floor=None),  # a floor that was not computed
        row(QWEN, M=1, dtype="fp8-tensor", time_us=60.0),
        row(QWEN, M=128, dtype="fp8-tensor", time_us=300.0),
    )


def test_throughput_columns_order_and_decode_rate():
    df = sample()
    t = throughput_table(df)
    assert list(t.columns) == THROUGHPUT_COLUMNS
    assert len(t) == len(df)  # every sample row is its own (model, dtype, M, path)
    keys = list(zip(t["model"], t["dtype"], t["M"], t["path"], strict=True))
    assert keys == sorted(keys)
    layers = {r["model"]: r["moe_layers"] for r in df.to_dict("records")}
    for r in t.to_dict("records"):
        expected = r["M"] / (layers[r["model"]] * r["time_us"] * 1e-6)
        assert r["decode_tok_s"] == pytest.approx(expected)


def test_throughput_excludes_rows_that_are_not_ok():
    df = frame(
        row(M=16, time_us=200.0),
        row(M=16, time_us=50.0, status="incorrect", correct=False),  # fast but wrong: never shown
        row(M=64, time_us=10.0, status="error"),
        row(M=256, status="unsupported", time_us=None),
    )
    t = throughput_table(df)
    assert t["M"].tolist() == [16]
    assert t["time_us"].tolist() == [200.0]


def test_throughput_keeps_the_fastest_row_of_a_point():
    # Two tile configs tried at the same point while tuning: the table shows the better one.
    other = dict(TILE, BLOCK_SIZE_N=128)
    t = throughput_table(frame(row(M=32, time_us=150.0), row(M=32, time_us=120.0, config=other)))
    assert t["time_us"].tolist() == [120.0]


def test_ttft_default_prompt_lengths_are_prefill_sized_M():
    df = sample()
    t = ttft_table(df)
    assert list(t.columns) == TTFT_COLUMNS
    measured = set(df["M"])
    assert set(t["prompt_len"]) == {m for m in measured if m >= 128}
    for r in t.to_dict("records"):
        src = df[(df["model"] == r["model"]) & (df["dtype"] == r["dtype"]) & (df["path"] == r["path"])
                 & (df["M"] == r["prompt_len"])].iloc[0]
        assert r["moe_ttft_ms"] == pytest.approx(src["moe_layers"] * src["time_us"] / 1000)


def test_ttft_uses_all_M_when_none_is_prefill_sized():
    df = frame(row(M=1, time_us=80.0), row(M=16, time_us=90.0))
    t = ttft_table(df)
    assert t["prompt_len"].tolist() == [1, 16]
    assert t["moe_ttft_ms"].tolist() == pytest.approx([32 * 80.0 / 1000, 32 * 90.0 / 1000])


def test_ttft_explicit_prompt_lengths_and_unmeasured_length():
    df = sample()
    t = ttft_table(df, prompt_lens=[512])
    # only mixtral/triton measured M=512
    assert t[["model", "path", "prompt_len"]].values.tolist() == [["mixtral-8x7b", "triton", 512]]
    with pytest.raises(UserError, match="2048"):
        ttft_table(df, prompt_lens=[2048])


def test_render_csv_round_trips_through_pandas():
    t = throughput_table(sample())
    back = pd.read_csv(io.StringIO(render(t, "csv", "throughput")))
    assert list(back.columns) == THROUGHPUT_COLUMNS
    pd.testing.assert_frame_equal(back, t, check_dtype=False)


def test_render_json_round_trips_with_nan_as_null():
    t = throughput_table(sample())
    records = json.loads(render(t, "json", "throughput"))
    assert len(records) == len(t)
    for rec, expected in zip(records, t.to_dict("records"), strict=True):
        assert list(rec) == THROUGHPUT_COLUMNS
        for col, val in expected.items():
            if isinstance(val, float) and math.isnan(val):
                assert rec[col] is None
            elif isinstance(val, float):
                assert rec[col] == pytest.approx(val)
            else:
                assert rec[col] == val
    assert any(rec["pct_of_floor"] is None for rec in records)  # the sample's missing floor


def _rendered(table: pd.DataFrame, title: str) -> str:
    console = Console(record=True, width=200)
    assert render(table, "table", title, console=console) is None
    return console.export_text()


def test_render_table_shows_headers_and_readable_numbers_without_caption_on_gpu():
    df = frame(row(M=128, time_us=123.44, pct_of_floor=None))
    t = throughput_table(df)
    text = _rendered(t, "MoE throughput")
    assert "MoE throughput" in text
    header = next(line for line in text.splitlines() if "time_us" in line)
    data = next(line for line in text.splitlines() if "mixtral-8x7b" in line)
    headers = [c.strip() for c in header.strip("┃ ").split("┃")]
    cells = dict(zip(headers, [c.strip() for c in data.strip("│ ").split("│")], strict=True))
    assert headers == THROUGHPUT_COLUMNS
    assert cells["time_us"] == "123.4"  # 1 decimal
    rate = 128 / (32 * 123.44e-6)
    assert cells["decode_tok_s"] == f"{rate:,.0f}" and "," in cells["decode_tok_s"]  # thousands separator
    assert cells["pct_of_floor"] == "-"  # floor not computed
    assert INTERPRETER_CAPTION not in text


def test_render_table_says_when_timings_come_from_the_interpreter():
    df = frame(row(M=1, interpreter=True, device_name="cpu", floor_us=None, pct_of_floor=None))
    assert interpreter_caption(df) == INTERPRETER_CAPTION
    assert interpreter_caption(frame(row())) is None
    assert INTERPRETER_CAPTION in _rendered(throughput_table(df), "MoE throughput")
    assert INTERPRETER_CAPTION in _rendered(ttft_table(df), "MoE TTFT")
    console = Console(record=True, width=200)
    render(throughput_table(df), "table", "t", console=console, caption="")  # caller printed it already
    assert INTERPRETER_CAPTION not in console.export_text()
    # a table with no attrs (e.g. built by the caller) takes the caption explicitly
    plain = pd.DataFrame({"M": [1]})
    console = Console(record=True, width=200)
    render(plain, "table", "t", console=console, caption=interpreter_caption(df))
    assert INTERPRETER_CAPTION in console.export_text()


def test_render_refuses_an_unknown_format():
    """The commands offer only cli.console.FORMATS, so another format is a programming error, named."""
    with pytest.raises(ValueError, match="xml"):
        render(throughput_table(sample()), "xml", "t")


@pytest.mark.parametrize(
    "column, value, expected",
    [
        ("time_us", 1234.56, "1,234.6"),  # times: 1 decimal
        ("pct_of_floor", 87.25, "87.2%"),
        ("decode_tok_s", 1234567.8, "1,234,568"),  # big rates: separators, no decimals
        ("moe_ttft_ms", 3.14159, "3.14"),
        ("M", 4096, "4096"),
        ("time_us", None, "-"),
        ("tflops", float("nan"), "-"),
        ("model", "mixtral-8x7b", "mixtral-8x7b"),
    ],
)
def test_format_cell(column, value, expected):
    assert format_cell(column, value) == expected


def _tuned_rows() -> pd.DataFrame:
    """A tuned run by hand: two configs per triton point (plain and Swap-AB), bf16 and fp8, one cutlass row."""
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 3}
    rows = []
    for dtype, plain, swapped, pct in (("bf16", 100.0, 80.0, 50.0), ("fp8-tensor", 60.0, 50.0, 40.0)):
        for swap, t in ((False, plain), (True, swapped)):
            rows.append(dict(model="m", dtype=dtype, M=1, path="triton", status="ok", time_us=t,
                             pct_of_floor=pct * swapped / t, config={**cfg, "swap_ab": swap}, interpreter=False))
    rows.append(dict(model="m", dtype="bf16", M=1, path="cutlass", status="ok", time_us=160.0, pct_of_floor=25.0,
                     config=None, interpreter=False))
    return pd.DataFrame(rows)


def test_gains_table_ratios_come_from_the_rows():
    """swap_gain = best plain / best swapped; fp8_gain = bf16 best / fp8 best; vs_cutlass = cutlass / triton."""
    from moebench.report.tables import gains_table, geomean_pct_of_floor

    g = gains_table(_tuned_rows()).set_index("dtype")
    assert g.loc["bf16", "time_us"] == 80.0 and g.loc["bf16", "config"].endswith("swap")
    assert g.loc["bf16", "swap_gain"] == pytest.approx(100 / 80)
    assert g.loc["fp8-tensor", "fp8_gain"] == pytest.approx(80 / 50)
    assert g.loc["bf16", "vs_cutlass"] == pytest.approx(160 / 80)
    assert pd.isna(g.loc["fp8-tensor", "vs_cutlass"]) and pd.isna(g.loc["bf16", "fp8_gain"])
    geo, low = geomean_pct_of_floor(g)
    assert geo == pytest.approx((50 * 40) ** 0.5) and low == 40


def test_gains_name_each_points_commit_where_runs_differ():
    """Rows drawn from runs of two commits: a last column names the commit of each point's best row; rows
    of one commit (or none recorded) get no such column."""
    from moebench.report.tables import GAINS_COLUMNS, gains_table

    df = _tuned_rows()
    df["commit"] = "aaaaaaa"
    assert list(gains_table(df).columns) == GAINS_COLUMNS
    assert list(gains_table(_tuned_rows()).columns) == GAINS_COLUMNS
    faster = df[(df["dtype"] == "bf16") & (df["path"] == "triton")].head(1).assign(time_us=10.0, commit="bbbbbbb")
    g = gains_table(pd.concat([df, faster], ignore_index=True)).set_index("dtype")
    assert g.loc["bf16", "commit"] == "bbbbbbb" and g.loc["bf16", "time_us"] == 10.0
    assert g.loc["fp8-tensor", "commit"] == "aaaaaaa"


def test_gains_config_names_the_fields_set_away_from_their_defaults():
    """The config column of the gains table spells out the fields a reader needs to rebuild the tile:
    row tiles per group only when more than one, and the moebench-only switches when on."""
    from moebench.report.tables import gains_table

    df = _tuned_rows()
    df.loc[df["time_us"] == 80.0, "config"] = [{**df.loc[0, "config"], "GROUP_SIZE_M": 8, "swap_ab": True,
                                                "atomic_sum": False, "split_k": 4, "gemm1_tma": True}]
    g = gains_table(df).set_index("dtype")
    assert g.loc["bf16", "config"] == "16x64x128 w4 s3 g8 swap stored-sum split4 tma"
    assert g.loc["fp8-tensor", "config"] == "16x64x128 w4 s3 swap"  # GROUP_SIZE_M 1: not named
    df.loc[df["time_us"] == 80.0, "config"] = [{**df.loc[0, "config"], "split_k": 4, "gemm2_split_k": 2,
                                                "atomic_out": True}]
    assert gains_table(df).set_index("dtype").loc["bf16", "config"] == "16x64x128 w4 s3 out-sum split4 g2split2"


def _cpu_rows() -> pd.DataFrame:
    """An interpreter run by hand: three checked points (one failed its check) and one the path cannot run."""
    cpu = dict(interpreter=True, device_name="cpu (x86_64)", floor_us=None, pct_of_floor=None)
    return frame(
        row(M=1, time_us=9000.0, rel_err=3e-4, **cpu),
        row(M=16, time_us=9500.0, rel_err=2e-4, **cpu),
        row(M=16, path="torch", time_us=800.0, rel_err=0.0, **cpu),
        row(M=256, status="incorrect", correct=False, rel_err=0.5, time_us=None, **cpu),  # wrong: shown as such
        row(M=512, status="unsupported", correct=None, rel_err=None, time_us=None, **cpu),  # never checked
    )


def test_an_interpreter_run_shows_its_check_not_throughput():
    """Interpreter rows: correct and rel_err follow the throughput columns, failed checks are listed, and
    the throughput figures (GPU-like claims from CPU wall clock) are empty."""
    from moebench.report.tables import CHECK_COLUMNS, INTERPRETER_VIEW, is_interpreter_run

    df = _cpu_rows()
    assert is_interpreter_run(df) and not is_interpreter_run(sample())
    t = throughput_table(df)
    assert list(t.columns) == THROUGHPUT_COLUMNS + CHECK_COLUMNS
    assert list(zip(t["M"], t["path"], t["correct"], strict=True)) == [
        (1, "triton", True), (16, "torch", True), (16, "triton", True), (256, "triton", False)]
    assert t[["pct_of_floor", "tflops", "gbps", "decode_tok_s"]].isna().all().all()
    assert t.attrs["people_columns"] == INTERPRETER_VIEW
    text = _rendered(t, "check")
    header = next(line for line in text.splitlines() if "model" in line)
    assert [c.strip() for c in header.strip("┃ ").split("┃")] == INTERPRETER_VIEW
    assert INTERPRETER_CAPTION in text and "5.00e-01" in text and "no" in text
    assert list(json.loads(render(t, "json", "t"))[0]) == THROUGHPUT_COLUMNS + CHECK_COLUMNS  # programs: all


def test_gpu_rows_beside_interpreter_rows_keep_their_figures():
    """Rows of two runs together (a GPU one, a CPU one): the GPU rows' figures stay, every column is shown."""
    t = throughput_table(pd.concat([frame(row(M=1, time_us=80.0)), _cpu_rows()], ignore_index=True))
    gpu = t[t["time_us"] == 80.0].iloc[0]
    assert gpu["tflops"] == 1.5 and gpu["pct_of_floor"] == 50.0 and "people_columns" not in t.attrs


def test_the_printed_ttft_table_is_gpu_prefill_only():
    """No TTFT from interpreter rows or from M below prefill size (a 1-token layer is no first token)."""
    from moebench.report.tables import prefill_ttft_table

    assert prefill_ttft_table(_cpu_rows()).empty
    assert list(prefill_ttft_table(_cpu_rows()).columns) == TTFT_COLUMNS
    assert prefill_ttft_table(frame(row(M=1), row(M=16))).empty  # GPU, decode only
    t = prefill_ttft_table(pd.concat([sample(), _cpu_rows().assign(M=4096)], ignore_index=True))
    assert set(t["prompt_len"]) == {128, 512, 4096} and t.attrs["caption"] == TTFT_NOTE  # no interpreter warning
    pd.testing.assert_frame_equal(t, ttft_table(sample()))  # the GPU rows' table, unchanged


# ---- rows read back: checked against the schema ---------------------------------------------------------

def _rec(**over) -> dict:
    """A whole row as a run writes it (``row`` and its seed)."""
    return {"seed": 0, **row(**over)}


def _folder(tmp_path, lines: list[str], **meta):
    """A run folder whose rows.jsonl holds ``lines`` as they are."""
    run = tmp_path / "run"
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"schema_version": 1, "status": "complete", **meta}))
    (run / "rows.jsonl").write_text("".join(line + "\n" for line in lines))
    return run


@pytest.mark.parametrize("bad, fragment", [
    ({"M": "16"}, "line 2 is no row: field 'M' is string '16', expected int"),  # once a TypeError traceback
    ({"time_us": "fast"}, "line 2 is no row: field 'time_us' is string 'fast', expected int or float"),
    ({"status": "great"}, "line 2 is no row: field 'status' is 'great', expected one of ok,"),
])
def test_a_wrong_typed_row_is_one_line_naming_file_line_and_field(tmp_path, bad, fragment):
    from helpers import moebench_in_process

    run = _folder(tmp_path, [json.dumps(_rec()), json.dumps(_rec(**bad))])
    done = moebench_in_process("report", str(run))
    assert (done.returncode, done.stdout) == (2, "")
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {run / 'rows.jsonl'}: {fragment}")


def test_rows_of_another_schema_are_refused_not_printed_as_none(tmp_path):
    """Once: 'None: None None M=None' and exit 0."""
    from helpers import moebench_in_process

    run = _folder(tmp_path, [json.dumps({"name": "probe", "us": 3.5})])
    done = moebench_in_process("report", str(run))
    assert done.returncode == 2 and "None" not in done.stdout
    assert done.stderr.strip() == (f"error: {run / 'rows.jsonl'}: line 1 is no row: field 'model' is missing "
                                   "(not a moebench benchmark row)")


@pytest.mark.parametrize("command", [("report",), ("report", "--format", "csv"), ("compare", "--by", "path"),
                                     ("plot", "--out", "plots")])
def test_a_run_with_no_rows_says_so_in_one_line(tmp_path, command):
    """Every command that reads runs needs rows: an empty rows.jsonl is one error line, exit 2."""
    from helpers import moebench_in_process

    run = _folder(tmp_path, [])
    done = moebench_in_process(command[0], str(run), *command[1:], cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.strip().splitlines()[-1] == (f"error: {run}: no rows: the run recorded no point "
                                                    "(rows.jsonl is empty), nothing to read")


def test_an_empty_run_beside_others_is_a_warning(tmp_path):
    from helpers import moebench_in_process

    base = tmp_path / "baseline"
    base.mkdir()
    _folder(tmp_path / "a", [json.dumps(_rec())]).rename(base / "full")
    _folder(tmp_path / "b", []).rename(base / "empty")
    done = moebench_in_process("report", str(base), "--format", "csv")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 2
    assert f"warning: run {base / 'empty'}: no rows (rows.jsonl is empty)" in done.stderr


def test_a_tune_reports_its_failed_candidates_as_a_count_on_stderr(tmp_path):
    """Failed candidates are part of a tune's search: counted on stderr, not listed as error lines on stdout;
    the throughput table takes the final re-timings, not the shorter screening ones."""
    from helpers import moebench_in_process

    lines = [row(M=16, phase="screen", time_us=50.0), row(M=16, phase="final", time_us=80.0),
             *[row(M=16, status="error", time_us=None, failure="resources", error="OutOfResources: smem")] * 3,
             row(M=16, status="error", time_us=None, failure="compile", error="CompilationError")]
    run = _folder(tmp_path, [json.dumps({"seed": 0, **r}) for r in lines], tune=True)
    done = moebench_in_process("report", str(run))
    assert done.returncode == 0 and "error" not in done.stdout and "80.0" in done.stdout
    assert done.stderr.strip() == ("4 tuning candidate(s) of 6 failed (resources 3, compile 1); the run's rows "
                                   "hold their errors")
