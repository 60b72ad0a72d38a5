"""Step runs (``moebench step``) in the reports: ``report`` prints the tables the step composes, for people and
programs; ``compare`` sets two runs' composed steps side by side against noise (correctness only on the
interpreter); ``plot`` draws each step's composition; the HTML page shows the step tables; step runs are not read
with sweeps. One real step run is made on the CPU (the tiny model, the torch path: about a second); the other
folders are copies of it with rows edited, each test saying how."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from helpers import moebench_in_process

from moebench.errors import UserError
from moebench.report import compose, runs, steps
from moebench.report.page import render_html
from moebench.report.step_chart import part_terms
from moebench.report.tables import INTERPRETER_CAPTION, format_cell
from moebench.step.config import StepPoint, get_step
from moebench.store.step_rows import STEP_COLUMNS

QUICK = Path(__file__).resolve().parent / "data" / "h200-quick"  # a sweep run folder
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
POINTS = (StepPoint("prefill", 1, 8), StepPoint("decode", 2, 16))  # one TTFT step, one decode step
SPREAD = 0.025  # the faked GPU runs' parts: p20 and p80 at -/+ 2.5% of the median


@pytest.fixture(scope="module")
def step_run(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A real step run folder of the tiny model on the CPU (torch path, one-layer stack) and its rows as
    ``run_step`` returned them."""
    from moebench.step.run import StepRequest, run_step

    request = StepRequest(get_step("tiny"), "fp16", ("torch",), POINTS, vs="torch", stack_layers=1)
    return run_step(request, tmp_path_factory.mktemp("step"))


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rows.jsonl").read_text().splitlines()]


def copy_run(src: Path, dst: Path, edit=lambda r: r, gpu: bool = False, **meta) -> Path:
    """``src`` copied to ``dst`` with each row passed through ``edit``; ``gpu``: the run marked as not from the
    interpreter (meta and rows) with every measured part's p20 / p80 at -/+ SPREAD, so its times are compared as
    a GPU run's (an interpreter run is compared for correctness only, and its CPU spreads are wide)."""
    shutil.copytree(src, dst)
    m = {**json.loads((dst / "meta.json").read_text()), **meta}
    rows = _rows(dst)
    if gpu:
        m["interpreter"] = False
        rows = [{**r, "interpreter": False} | ({"time_p20_us": r["time_us"] * (1 - SPREAD),
                                                 "time_p80_us": r["time_us"] * (1 + SPREAD)}
                                                if r["measured"] and r["time_us"] is not None else {}) for r in rows]
    (dst / "meta.json").write_text(json.dumps(m))
    (dst / "rows.jsonl").write_text("".join(json.dumps(edit(r)) + "\n" for r in rows))
    return dst


def scaled(part: str, phase: str, factor: float):
    """An ``edit``: the ``part`` rows of ``phase`` with their times (median, p20, p80) x ``factor``."""
    def edit(r: dict) -> dict:
        if r["part"] != part or r["phase"] != phase:
            return r
        return {**r, **{k: r[k] * factor for k in ("time_us", "time_p20_us", "time_p80_us")}}
    return edit


# ---- report --------------------------------------------------------------------------------------------------

def test_report_tables_are_the_steps_own(step_run):
    """The loaded run's tables equal compose's on the rows run_step returned (None kept None through the loader,
    each run composed with its --vs); the parts table keeps every step column."""
    run, rows = step_run
    loaded = runs.load([run])
    assert [r.kind for r in loaded.runs] == ["step"] and loaded.rows.empty  # step parts are no benchmark rows
    tables = steps.run_tables(loaded.steps)
    composed = compose.compose(rows, "torch")
    expected = {"ttft": compose.ttft_records(composed), "decode": compose.decode_records(composed),
                "stack": compose.stack_records(rows)}
    for name, records in expected.items():
        got = tables[name].to_dict("records")
        assert len(got) == len(records) > 0, name
        for g, e in zip(got, records, strict=True):
            assert g == pytest.approx(e, nan_ok=True), name
    assert tables["ttft"].iloc[0]["e2e_vs"] == 1.0  # the vs path's own step, against itself: --vs was read
    assert list(tables["parts"].columns) == list(STEP_COLUMNS) and len(tables["parts"]) == len(rows)
    assert tables["ttft"].attrs["caption"] == INTERPRETER_CAPTION


def test_report_cli_prints_the_step_tables_for_people_and_programs(step_run):
    """`report STEP_RUN` prints ttft, decode and stack (titled with the model, the interpreter warning under each);
    json holds compose's records; csv one table with compose's columns; --table parts shows the parts' view."""
    run, rows = step_run
    proc = moebench_in_process("report", str(run))
    assert proc.returncode == 0, proc.stderr
    for title in ("ttft: tiny fp16", "decode: tiny fp16", "stack: tiny fp16"):
        assert title in proc.stdout
    assert proc.stdout.count(INTERPRETER_CAPTION) == 3
    doc = json.loads(moebench_in_process("report", str(run), "--format", "json").stdout)
    assert set(doc) == {"ttft", "decode", "stack"}
    (ttft,) = doc["ttft"]
    (step,) = compose.ttft_records(compose.compose(rows, "torch"))
    assert ttft["prompt"] == 8 and ttft["ttft_ms"] == pytest.approx(step["ttft_ms"]) and ttft["missing"] is None
    csv = moebench_in_process("report", str(run), "--format", "csv", "--table", "decode").stdout
    table = pd.read_csv(pd.io.common.StringIO(csv))
    assert list(table.columns) == compose.DECODE_COLUMNS and table["batch"].tolist() == [2]
    parts = moebench_in_process("report", str(run), "--table", "parts").stdout
    assert "parts: tiny fp16" in parts and "dense_mlp" in parts and "rel_err" in parts


def test_several_step_runs_side_by_side(step_run, tmp_path):
    """Two runs of different models report together, a model each; the same run twice is refused in one line
    (its steps would be summed as one)."""
    run, _ = step_run
    other = copy_run(run, tmp_path / "other", lambda r: {**r, "model": "tiny-b"}, model="tiny-b")
    doc = json.loads(moebench_in_process("report", str(run), str(other), "--format", "json").stdout)
    assert [r["model"] for r in doc["ttft"]] == ["tiny", "tiny-b"]
    twin = copy_run(run, tmp_path / "twin")
    proc = moebench_in_process("report", str(run), str(twin))
    assert proc.returncode == 2 and "both measured tiny fp16 torch prefill" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, says", [
    (("report", "{step}", str(QUICK)), "step runs are read only with step runs"),  # one table of one kind
    (("compare", "{step}", str(QUICK)), "compare step runs with step runs"),  # BASE and NEW are two loads
    (("compare", str(QUICK), "{step}"), "compare step runs with step runs"),  # the other way round
    (("compare", "{step}", "{step}", "--fail-slower", "5"), "the gate (--fail-slower, --fail-on-slower) reads sweeps"),
    (("report", "{step}", "--table", "throughput"), "a step run has the tables ttft, decode, stack, parts"),
    (("report", "{step}", "--gains"), "--gains reads a sweep's"),
    (("compare", "{step}", "--by", "path"), "--by compares a sweep's variants"),
])
def test_what_step_runs_refuse_is_one_line(step_run, args, says):
    run, _ = step_run
    proc = moebench_in_process(*(a.format(step=run) for a in args))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines


# ---- compare -------------------------------------------------------------------------------------------------

def test_compare_finds_the_slower_step_against_noise(step_run, tmp_path):
    """Faked GPU runs (meta and rows marked not interpreter, every part's spread -/+ 2.5%), the new one's decode MoE
    layer 1.5x slower: the decode step is SLOWER by the MoE layers' share of it, the prefill step SAME, and the
    noise is the parts' spread composed as the step sums them (5%)."""
    run, rows = step_run
    base = copy_run(run, tmp_path / "base", gpu=True)
    new = copy_run(run, tmp_path / "new", scaled("moe", "decode", 1.5), gpu=True)
    b, n = steps.step_points(runs.load([base]).steps), steps.step_points(runs.load([new]).steps)
    table = steps.compare_steps(b, n)
    assert list(table.columns) == steps.STEP_COMPARE_COLUMNS
    assert table["phase"].tolist() == ["prefill", "decode"]
    assert table["verdict"].tolist() == ["SAME", "SLOWER"]
    (dec,) = compose.decode_records(compose.compose(rows))
    assert table.iloc[1]["base_ms"] == pytest.approx(dec["tpot_ms"])
    assert table.iloc[1]["ratio"] == pytest.approx(1 + 0.5 * dec["moe_ms"] / dec["tpot_ms"])
    assert table["noise"].tolist() == pytest.approx([2 * SPREAD, 2 * SPREAD])
    proc = moebench_in_process("compare", str(base), str(new), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert [r["verdict"] for r in json.loads(proc.stdout)] == ["SAME", "SLOWER"]


def test_compare_without_a_parts_spread_is_unknown(step_run, tmp_path):
    """A step whose part recorded no p20 / p80 has no known noise: UNKNOWN, never SAME."""
    run, _ = step_run
    base = copy_run(run, tmp_path / "base", gpu=True)
    new = copy_run(run, tmp_path / "new", lambda r: {**r, "time_p20_us": None} if r["part"] == "head" else r,
                   gpu=True)
    b, n = steps.step_points(runs.load([base]).steps), steps.step_points(runs.load([new]).steps)
    assert steps.compare_steps(b, n)["verdict"].tolist() == ["UNKNOWN", "UNKNOWN"]


def test_compare_interpreter_runs_for_correctness_only(step_run, tmp_path):
    """Interpreter runs: a part that fails its check in the new run makes its step BROKEN, the other CORRECT; no
    time is set side by side."""
    run, _ = step_run
    broken = copy_run(run, tmp_path / "broken", lambda r: {**r, "status": "incorrect", "correct": False,
                                                           "time_us": None}
                      if r["part"] == "attention" and r["phase"] == "decode" else r)
    proc = moebench_in_process("compare", str(run), str(broken), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    table = json.loads(proc.stdout)
    assert [(r["phase"], r["verdict"]) for r in table] == [("prefill", "CORRECT"), ("decode", "BROKEN")]
    assert "ratio" not in table[0]


# ---- plot and page -------------------------------------------------------------------------------------------

def test_plot_draws_each_steps_composition(step_run, tmp_path):
    """`plot STEP_RUN` writes step.png; its bars are compose's terms, which add up to the tables' times."""
    run, rows = step_run
    proc = moebench_in_process("plot", str(run), "--out", str(tmp_path / "plots"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(tmp_path / "plots" / "step.png")]
    assert (tmp_path / "plots" / "step.png").read_bytes().startswith(PNG_MAGIC)
    bars = part_terms(rows)
    tables = steps.step_tables(rows, "torch")
    totals = [*tables["ttft"]["ttft_ms"], *tables["decode"]["tpot_ms"]]
    assert [sum(b["terms"].values()) for b in bars] == pytest.approx(totals)
    assert {p for b in bars for p, t in b["terms"].items() if t} == {"attention", "router", "moe", "dense_mlp", "head"}


def test_page_shows_the_step_tables(step_run):
    """The HTML page of a step run holds its ttft, decode, stack and parts tables, cells formatted as the CLI's,
    and the step's chart."""
    run, rows = step_run
    page = render_html(runs.load([run]))
    for name in steps.STEP_TABLES:
        assert f"({name}: tiny fp16)</h3>" in page
    (ttft,) = compose.ttft_records(compose.compose(rows, "torch"))
    assert f">{format_cell('ttft_ms', ttft['ttft_ms'])}</td>" in page
    assert "step part row" in page and 'alt="Each step&#x27;s composition' in page


def test_a_step_row_missing_a_field_is_named(step_run, tmp_path):
    """A step folder's line lacking a field compose reads is refused naming the line and the field."""
    run, _ = step_run
    bad = copy_run(run, tmp_path / "bad", lambda r: {k: v for k, v in r.items() if k != "count"})
    with pytest.raises(UserError, match="line 1 is no row: field 'count' is missing"):
        runs.load([bad])


# ---- a step read with a trace: the cold start ----------------------------------------------------------------

def _trace_run(folder: Path, excess_ms: list[float], specialize: bool = False, model: str = "tiny") -> Path:
    """A trace run folder (as ``moebench trace`` writes one) of ``model`` fp16 whose requests paid ``excess_ms``."""
    folder.mkdir(parents=True)
    meta = {"schema_version": 1, "status": "complete", "kind": "trace", "model": model, "dtype": "fp16",
            "cache_mode": "cold", "specialize": specialize, "interpreter": False, "device_name": "cpu"}
    (folder / "meta.json").write_text(json.dumps(meta))
    rows = [{"i": i, "M": 8, "config": "16x32x32 w4 s3", "config_source": "heuristic", "latency_ms": 1.0 + x,
             "warm_ms": 1.0, "excess_ms": x, "compiles": int(x > 0), "compile_kernels": [], "compile_s": [],
             "from_disk": [], "new_cache_entries": 0} for i, x in enumerate(excess_ms)]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_a_trace_beside_a_step_gives_the_cold_start_ttft_of_its_triton_prefill_steps(step_run, tmp_path):
    """The step's torch rows relabelled triton (the path a trace replays); the trace's first request paid 500 ms,
    requests 2-20 nothing, 21-24 a mean of 25 ms: the cold TTFT is the warm one plus 500 ms, and after the first
    20 requests the warm one plus 25 ms."""
    run = copy_run(step_run[0], tmp_path / "step", edit=lambda r: {**r, "path": r["path"] and "triton"}, vs=None)
    excess = [500.0] + [0.0] * 19 + [0.0, 100.0, 0.0, 0.0]
    trace = _trace_run(tmp_path / "trace", excess)
    done = moebench_in_process("report", str(run), str(trace), "--format", "csv", "--table", "cold_start")
    assert done.returncode == 0, done.stderr
    (cold,) = pd.read_csv(pd.io.common.StringIO(done.stdout)).to_dict("records")
    ttft = steps.step_tables(_rows(run))["ttft"].iloc[0]
    assert (cold["prompt"], cold["cache"], cold["trace"]) == (8, "cold", "trace")
    assert cold["warm_ttft_ms"] == pytest.approx(ttft["ttft_ms"])
    assert cold["cold_ttft_ms"] == pytest.approx(ttft["ttft_ms"] + 500.0)
    assert cold["compile_first_20_ms"] == pytest.approx(25.0) and cold["compile_after_20_ms"] == pytest.approx(25.0)
    assert cold["ttft_after_20_ms"] == pytest.approx(ttft["ttft_ms"] + 25.0)


def test_a_trace_of_another_model_or_a_sweep_beside_a_step_is_refused(step_run, tmp_path):
    run = copy_run(step_run[0], tmp_path / "step", edit=lambda r: {**r, "path": r["path"] and "triton"})
    other = _trace_run(tmp_path / "trace", [1.0], model="tiny-mla")
    done = moebench_in_process("report", str(run), str(other), "--table", "cold_start")
    assert done.returncode == 2 and "no step run named has its prefill steps" in done.stderr
    assert moebench_in_process("report", str(step_run[0]), "--table", "cold_start").returncode == 2  # no trace
