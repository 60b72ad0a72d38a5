"""The HTML page of runs: self-contained (nothing fetched, no scripts), the CLI's numbers, escaped text, written
whole; and, where chromium is installed, a real browser draws it."""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import signal
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from moebench.report import charts as plot
from moebench.report import runs
from moebench.report import tables as report
from moebench.report.page import render_html, write_html

DATA = Path(__file__).resolve().parent / "data"
KERNELS = DATA / "h200-kernels"  # 56 ok rows (triton and cutlass), 14 unsupported, TTFT-sized M
QUICK = DATA / "h200-quick"  # another commit and other ceilings, for a page of two runs
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
INJECTED = "<b>injected</b>"  # text from a row that must come out as text, not markup
CHROMIUM = "/usr/bin/chromium"


def _kernel_rows_text() -> str:
    """The kernels run's rows as text (the fixture keeps them gzipped)."""
    return gzip.decompress((KERNELS / "rows.jsonl.gz").read_bytes()).decode()


class Page(HTMLParser):
    """What the tests read of a page: every start tag with its attributes, each table (the heading above it, h2
    or h3, and its rows of cell texts), the <div class="warn"> texts and all text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.tables: list[tuple[str, list[list[str]]]] = []
        self.warnings: list[str] = []
        self.text: list[str] = []
        self._h3, self._cell, self._warn = "", None, None
        self._in_h3 = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag in ("h2", "h3"):
            self._in_h3, self._h3 = True, ""
        elif tag == "table":
            self.tables.append((self._h3, []))
        elif tag == "tr":
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag == "div" and a.get("class") == "warn":
            self._warn = ""

    def handle_endtag(self, tag):
        if tag in ("h2", "h3"):
            self._in_h3 = False
        elif tag in ("td", "th"):
            self.tables[-1][1][-1].append(self._cell)
            self._cell = None
        elif tag == "div" and self._warn is not None:
            self.warnings.append(self._warn)
            self._warn = None

    def handle_data(self, data):
        self.text.append(data)
        if self._in_h3:
            self._h3 += data
        if self._cell is not None:
            self._cell += data
        if self._warn is not None:
            self._warn += data

    def table(self, title: str) -> list[list[str]]:
        """Header and cell rows of the one table under the heading ``title``."""
        found = [rows for h3, rows in self.tables if h3 == title]
        assert len(found) == 1, f"{len(found)} tables titled {title!r}; titles: {[t for t, _ in self.tables]}"
        return found[0]

    def all_text(self) -> str:
        return "".join(self.text)


def fake_chart(title: str = "a chart & its <title>") -> plot.Chart:
    fig = Figure(figsize=(2, 1.5))
    fig.add_subplot().plot([1, 2, 3], [3, 1, 2])
    return plot.Chart("fake", title, fig)


def cells(table: pd.DataFrame) -> list[list[str]]:
    """The table as the CLI prints it: its header, then each cell through ``report.format_cell``."""
    if people := table.attrs.get("people_columns"):
        table = table[list(people)]
    columns = [str(c) for c in table.columns]
    return [columns] + [[report.format_cell(c, v) for c, v in zip(columns, rec, strict=True)]
                        for rec in table.itertuples(index=False, name=None)]


def interpreter_run(folder: Path) -> Path:
    """A CPU-interpreter run folder by hand, from rows of the kernels run: four checked points, one that failed
    its check (its error carries markup) and one the path cannot run."""
    rows = [json.loads(line) for line in _kernel_rows_text().splitlines()]
    picked = [r for r in rows if r["model"] == "mixtral-8x7b" and r["dtype"] == "bf16" and r["M"] in (1, 4)]
    assert len(picked) == 4 and all(r["status"] == "ok" for r in picked)  # the case has what it claims
    cpu = dict(interpreter=True, device_name="cpu (x86_64)", timing_method="interpreter wall clock",
               floor_us=None, pct_of_floor=None, bound=None)
    wrong = {**picked[0], "M": 16, "status": "incorrect", "correct": False, "rel_err": 0.5, "time_us": None,
             "error": f"rel. error 0.5 > 0.02 against the fp32 reference {INJECTED}"}
    unsupported = {**picked[1], "M": 64, "status": "unsupported", "correct": None, "rel_err": None,
                   "time_us": None, "error": "needs a GPU"}
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text(
        "".join(json.dumps({**r, **cpu}) + "\n" for r in [*picked, wrong, unsupported]))
    meta = {k: v for k, v in json.loads((KERNELS / "meta.json").read_text()).items()
            if not k.startswith("gpu_") and k not in ("ceilings", "driver", "cuda")}
    meta.update(interpreter=True, device_name="cpu (x86_64)", timing_method="interpreter wall clock",
                git_commit="abc1234", sweep="quick")
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


@pytest.fixture(scope="module")
def kernels() -> runs.Runs:
    return runs.load([KERNELS])


@pytest.fixture(scope="module")
def kernels_page(kernels) -> str:
    return render_html(kernels, charts=[fake_chart()])


def test_the_page_fetches_nothing_and_runs_no_script(kernels_page):
    """Charts are PNG data URIs with the chart's title as alt text; no tag loads anything from a network."""
    page = Page(kernels_page)
    imgs = [a for t, a in page.tags if t == "img"]
    assert [a["alt"] for a in imgs] == ["a chart & its <title>"]
    for a in imgs:
        prefix = "data:image/png;base64,"
        assert a["src"].startswith(prefix)
        assert base64.b64decode(a["src"][len(prefix):], validate=True).startswith(PNG_MAGIC)
    assert not [t for t, _ in page.tags if t in ("script", "iframe", "object", "embed")]
    for tag, attrs in page.tags:
        for key in ("src", "href"):
            assert not str(attrs.get(key, "")).startswith(("http://", "https://", "//")), (tag, attrs)
        if tag == "link":
            assert attrs.get("rel") != "stylesheet", attrs
    assert "http://" not in kernels_page and "https://" not in kernels_page and "@import" not in kernels_page


@pytest.mark.parametrize("folder", [KERNELS, QUICK])
def test_the_tables_say_what_the_cli_says(folder):
    """Throughput, TTFT and gains tables hold ``format_cell`` of report's tables, cell for cell, and the gains
    table is followed by the CLI's geometric-mean line."""
    loaded = runs.load([folder])
    df = loaded.rows
    page = Page(render_html(loaded, charts=[]))
    assert page.table("Throughput (MoE layer)") == cells(report.throughput_table(df))
    ttft = report.prefill_ttft_table(df)
    assert len(ttft) and page.table("MoE share of time-to-first-token") == cells(ttft)
    gains = report.gains_table(df)
    assert len(gains) and page.table("Triton gains") == cells(gains)
    geo, low = report.geomean_pct_of_floor(gains)
    assert f"{len(gains)} points: geometric mean {geo:.1f}% of floor, lowest {low:.1f}%" in page.all_text()


def test_the_page_names_the_machine_its_ceilings_and_the_method(kernels, kernels_page):
    meta = kernels.runs[0].meta
    text = Page(kernels_page).all_text()
    for expected in (meta["device_name"], meta["driver"], meta["git_commit"], meta["timing_method"],
                     runs.ceilings_text(meta["ceilings"]), kernels.machine_line(), "float32 reference",
                     kernels.runs[0].label):
        assert expected in text, expected
    assert f"{meta['ceilings']['copy_gbps'] / 1000:.2f} TB/s" in text  # the copy ceiling, beyond the one-liner


def test_the_points_not_timed_are_listed_with_status_and_error(kernels, kernels_page):
    """The kernels run's 14 unsupported cutlass points: one line per model, with every M and the error."""
    bad = kernels.rows[kernels.rows["status"] != "ok"]
    assert len(bad) == 14 and set(bad["status"]) == {"unsupported"}
    table = Page(kernels_page).table("Points not timed")
    assert table[0] == ["status", "model", "dtype", "path", "M", "error"]
    listed = {(r[0], r[1], r[3]): r for r in table[1:]}
    assert set(listed) == {("unsupported", m, "cutlass") for m in set(bad["model"])}
    for (_, model, _), r in listed.items():
        ms = sorted(bad[bad["model"] == model]["M"])
        assert r[4] == ", ".join(map(str, ms)) and r[5] == bad["error"].iloc[0]


def test_an_interpreter_page_warns_and_shows_the_check_not_throughput(tmp_path):
    """The warning comes first; the table is the check (INTERPRETER_VIEW), no throughput column anywhere; the
    failed check is listed, and its error text is escaped. Charts come from plot.charts (the check chart)."""
    loaded = runs.load([interpreter_run(tmp_path / "cpu-run")])
    html = render_html(loaded)
    page = Page(html)
    assert report.INTERPRETER_CAPTION in page.warnings[0]
    first_table = next(i for i, (t, _) in enumerate(page.tags) if t == "table")
    first_warn = next(i for i, (t, a) in enumerate(page.tags) if t == "div" and a.get("class") == "warn")
    assert first_warn < first_table
    check = page.table("Correctness (CPU interpreter)")
    assert check == cells(report.throughput_table(loaded.rows)) and check[0] == report.INTERPRETER_VIEW
    assert ["mixtral-8x7b", "bf16", "16", "triton", "no", "5.00e-01"] in check
    headers = {c for _, rows in page.tables for c in (rows[0] if rows else [])}
    assert not headers & {"time_us", "pct_of_floor", "tflops", "gbps", "decode_tok_s", "moe_ttft_ms"}
    assert "Triton gains" not in [t for t, _ in page.tables]
    assert INJECTED not in html and "&lt;b&gt;injected&lt;/b&gt;" in html
    assert INJECTED in page.all_text()  # the text itself survives
    assert [a["alt"] for t, a in page.tags if t == "img"] == [c.title for c in plot.charts(loaded)]


def test_two_runs_on_one_page(kernels):
    """Each run's ceilings and commit appear; the machine table has a column per run; gains name the commits."""
    both = runs.load([KERNELS, QUICK])
    page = Page(render_html(both, charts=[]))
    text = page.all_text()
    for r in both.runs:
        assert r.label in text and r.meta["git_commit"] in text
        assert f"{r.meta['ceilings']['read_gbps'] / 1000:.2f} TB/s" in text
    machine = next(rows for _, rows in page.tables if rows and rows[0][1:] == [r.label for r in both.runs])
    assert ["device", "NVIDIA H200", "NVIDIA H200"] in machine
    assert page.table("Triton gains")[0][-1] == "commit"


def test_a_tune_run_shows_its_tuned_table(tmp_path):
    """A run with ``tune: true`` and a best.json: the tuned table is plot.tuned_table's, through format_cell."""
    folder = tmp_path / "tune-run"
    folder.mkdir()
    shutil.copy(KERNELS / "meta.json", folder / "meta.json")
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "tune": True}))
    (folder / "rows.jsonl").write_text(_kernel_rows_text().splitlines()[0] + "\n")
    best = {"model": "mixtral-8x7b", "dtype": "bf16", "kernel": "triton",
            "configs": {"1": {"config": {}, "time_us": 150.0, "default_us": 180.0},
                        "16": {"config": {}, "time_us": 600.0, "default_us": None}}}
    (folder / "best.json").write_text(json.dumps(best))
    loaded = runs.load([folder])
    expected = plot.tuned_table(loaded)
    assert len(expected) == 2
    assert Page(render_html(loaded, charts=[])).table("Tuned configs") == cells(expected)


def test_a_run_that_did_not_run_through_is_flagged(tmp_path):
    """The load's warnings (here: a run stopped by SIGTERM) stand in a warning box under the header."""
    folder = tmp_path / "stopped"
    folder.mkdir()
    meta = json.loads((KERNELS / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({
        **meta, "status": "interrupted", "stopped_by": "SIGTERM",
        "command": f"moebench trace --configs {tmp_path}/tables --out={tmp_path}/runs",  # paths as a user typed them
        "trace": {"configs_dir": f"{tmp_path}/tables", "distribution": f"csv:{tmp_path}/lengths.csv"}}))
    (folder / "rows.jsonl").write_text(_kernel_rows_text())
    loaded = runs.load([folder])
    assert loaded.warnings and "SIGTERM" in loaded.warnings[0]
    boxes = Page(render_html(loaded, charts=[])).warnings
    # each warning, its folder named by its name (a page with no folder of its own)
    assert all(any(w.replace(str(folder), "stopped") in box for box in boxes) for w in loaded.warnings)


def test_write_html_writes_the_page_and_nothing_else(tmp_path, kernels):
    out = write_html(kernels, tmp_path / "page.html", charts=[])
    assert out == tmp_path / "page.html"
    # the page names its runs from its own folder (how depends on where the checkout and tmp_path lie)
    assert out.read_text(encoding="utf-8") == render_html(kernels, charts=[], page_dir=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]


def test_a_browser_draws_the_page(tmp_path, kernels_page):
    """Headless chromium renders the page from disk: the screenshot is a PNG and not one flat colour."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no browser at {CHROMIUM}")
    from matplotlib.image import imread

    page = tmp_path / "page.html"
    page.write_text(kernels_page, encoding="utf-8")
    shot = tmp_path / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2400", f"--screenshot={shot}",
           page.as_uri()]
    browser = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
    try:
        browser.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(browser.pid, signal.SIGKILL)  # chromium's helpers are in the group this test started
        browser.wait()
        pytest.fail("chromium took over 90 s to draw one page")
    assert shot.is_file() and shot.read_bytes().startswith(PNG_MAGIC)
    pixels = imread(shot)
    assert pixels.shape[:2] == (2400, 1280)
    assert len({tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::97]}) > 10  # text, rules, a chart


@pytest.mark.parametrize("fail", ["os.open", "os.replace"])
def test_report_html_errors_name_the_page_not_its_temp_file(tmp_path, monkeypatch, fail):
    """`report --html page.html` failing while it writes (the temp file refused, or its rename) is one line that
    names page.html, the file asked for, never the hidden temp file beside it; nothing is left there."""
    import errno

    from helpers import moebench_in_process

    def refuse(src, *args, **kwargs):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(src), *args[:1] if fail == "os.replace" else ())

    monkeypatch.setattr(os, fail.split(".")[1], refuse)
    page = tmp_path / "page.html"
    proc = moebench_in_process("report", str(KERNELS), "--html", str(page), "--format", "csv", cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = [s for s in proc.stderr.splitlines() if s.startswith("error")]
    assert line == f"error: {page}: {os.strerror(errno.EACCES)}"
    assert list(tmp_path.iterdir()) == []


def test_a_page_without_floors_shows_no_nan_figure(tmp_path):
    """Rows with no % of floor (a tune run measures no ceilings) keep the gains table but print no "geometric
    mean nan% of floor" line: the figure is left out where there is none. Driven through `report --html`."""
    from helpers import moebench_in_process

    folder = tmp_path / "tune-run"
    folder.mkdir()
    meta = json.loads((KERNELS / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "tune": True, "ceilings": None}))
    rows = [{**json.loads(line), "pct_of_floor": None} for line in _kernel_rows_text().splitlines()]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = moebench_in_process("report", str(folder), "--html", str(tmp_path / "page.html"), "--format", "csv",
                               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    page = Page((tmp_path / "page.html").read_text())
    assert page.table("Triton gains") and "nan" not in page.all_text() and "geometric mean" not in page.all_text()


def test_a_trace_page_counts_its_requests_and_lists_no_sweep_method(tmp_path):
    """A trace run's page says how many requests it traced (not "0 rows") and its method names no sweep-only
    figure (% of floor, time_us): a trace has neither. Driven through `trace` then `report --html`."""
    from helpers import moebench_in_process

    proc = moebench_in_process("trace", "--model", "tiny", "--dtype", "fp16", "--requests", "3", "--out", "runs",
                               "--no-progress", "--format", "csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run,) = list((tmp_path / "runs").iterdir())
    proc = moebench_in_process("report", str(run), "--html", str(tmp_path / "page.html"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = Page((tmp_path / "page.html").read_text()).all_text()
    assert "1 run, 3 traced requests;" in text and "0 rows" not in text
    assert "% of floor" not in text and "time_us" not in text


def test_a_page_names_its_runs_from_its_own_folder_with_no_absolute_path(tmp_path):
    """Runs given by absolute path (one stopped, so its warning names the folder) and a page in another folder:
    the page names them ../runs/<name>, and no absolute path of this machine is in it."""
    folder = tmp_path / "runs" / "stopped"
    folder.mkdir(parents=True)
    meta = json.loads((KERNELS / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({
        **meta, "status": "interrupted", "stopped_by": "SIGTERM",
        "command": f"moebench trace --configs {tmp_path}/tables --out={tmp_path}/runs",  # paths as a user typed them
        "trace": {"configs_dir": f"{tmp_path}/tables", "distribution": f"csv:{tmp_path}/lengths.csv"}}))
    (folder / "rows.jsonl").write_text(_kernel_rows_text())
    loaded = runs.load([folder.absolute()])
    assert any(str(folder) in w for w in loaded.warnings)  # the precondition: a warning naming the folder
    page = write_html(loaded, tmp_path / "pages" / "page.html", charts=[]).read_text(encoding="utf-8")
    assert str(tmp_path) not in page
    assert "<p class=note>../runs/stopped</p>" in page and "run ../runs/stopped: interrupted" in page
    assert "--configs ../tables --out=../runs" in page and "csv:../lengths.csv" in page
