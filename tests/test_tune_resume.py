"""A stopped tune resumes: ``moebench tune`` killed part-way and started again continues in its folder and ends
with the rows and choices of a run never stopped, no measurement twice; SIGTERM stops it as "interrupted" with
exit status 143; a torn last row is cut off with a warning. The real command, in a process group of its own
(its workers are in it too), on the Triton interpreter where there is no GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from moebench.store.runfolder import META_FILE, ROWS_FILE, load_run, run_status
from moebench.tune.run import CHECK_PASSES

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 300  # for a whole run: on the interpreter one takes 10-20 s


def _cmd(out: Path, ms: str) -> list[str]:
    # limit=1: one config per M, so the chosen config does not depend on the interpreter's noisy wall-clock
    # times; two uninterrupted runs then choose alike and write the same rows.
    return [sys.executable, "-m", "moebench", "tune", "--model", "tiny", "--m", ms, "--strategy", "exhaustive",
            "--option", "limit=1", "--out", str(out), "--no-progress", "--format", "json"]


def _start(out: Path, ms: str) -> subprocess.Popen:
    return subprocess.Popen(_cmd(out, ms), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            process_group=0)


def _run(out: Path, ms: str) -> subprocess.CompletedProcess:
    done = subprocess.run(_cmd(out, ms), cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    return done


def _folder(out: Path) -> Path:
    (run,) = [p.parent for p in out.glob(f"*/{META_FILE}")]  # one run folder, resumed or not
    return run


def _wait_rows(proc: subprocess.Popen, out: Path, n: int) -> None:
    """Until the run under ``out`` has written ``n`` whole rows; fails if it ends first."""
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        rows = list(out.glob(f"*/{ROWS_FILE}"))
        if rows and rows[0].read_text().count("\n") >= n:
            return
        assert proc.poll() is None, f"the tune ended before {n} rows: {proc.communicate()[1]}"
        time.sleep(0.05)
    pytest.fail(f"no {n} rows after {WAIT_S} s")


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def _group_gone(pgid: int, wait_s: float = 5.0) -> bool:
    """Whether no process of the group ``pgid`` is left (within ``wait_s``)."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _lines(run: Path) -> list[str]:
    return (run / ROWS_FILE).read_text().splitlines()


def _keys(run: Path) -> list[tuple]:
    """What each row measured: (M, config, phase)."""
    return [(r["M"], json.dumps(r["config"], sort_keys=True), r["phase"]) for r in map(json.loads, _lines(run))]


def _choices(run: Path) -> dict:
    best = json.loads((run / "best.json").read_text())
    return {M: (v["config"], v["default"]) for M, v in best["configs"].items()}


def test_a_killed_tune_resumes_to_the_rows_and_choices_of_an_uninterrupted_one(tmp_path):
    ms = "1,2"
    ref = _start(tmp_path / "ref", ms)  # the run never stopped, alongside
    proc = _start(tmp_path / "run", ms)
    try:
        _wait_rows(proc, tmp_path / "run", 2)
        os.killpg(proc.pid, signal.SIGKILL)  # the tuner and its workers: nothing records the end
        proc.communicate()
        run = _folder(tmp_path / "run")
        assert run_status(json.loads((run / META_FILE).read_text())) == "killed"
        killed = _lines(run)
        done = _run(tmp_path / "run", ms)
        ref_out, ref_err = ref.communicate(timeout=WAIT_S)
        assert ref.returncode == 0, ref_err
    finally:
        _kill_group(proc)
        _kill_group(ref)
    assert _folder(tmp_path / "run") == run and json.loads(done.stdout)["run"] == str(run)
    reference = _folder(tmp_path / "ref")
    assert 2 <= len(killed) < len(_lines(reference))  # the precondition: stopped part-way
    keys = _keys(run)
    # nothing measured twice, but the back-to-back check's passes
    assert [k for k, n in Counter(keys).items() if n > (CHECK_PASSES if k[-1] == "default" else 1)] == []
    assert Counter(keys) == Counter(_keys(reference))
    assert _lines(run)[:len(killed) - 1] == killed[:-1]  # the rows kept stay as they were (the last may be torn)
    meta = json.loads((run / META_FILE).read_text())
    (resumed,) = meta["resumed"]
    assert meta["status"] == "complete" and resumed["previous_status"] == "killed"
    assert resumed["rows_kept"] >= len(killed) - 1
    assert _choices(run) == _choices(reference)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> dict:
    """A tune stopped by SIGTERM after its first row: its folder, exit status, stderr and meta at that point."""
    out = tmp_path_factory.mktemp("term")
    proc = _start(out, "1")
    try:
        _wait_rows(proc, out, 1)
        os.kill(proc.pid, signal.SIGTERM)  # the tuner alone: it stops its workers itself
        _, err = proc.communicate(timeout=60)
        gone = _group_gone(proc.pid)
    finally:
        _kill_group(proc)
    run = _folder(out)
    return {"out": out, "run": run, "rc": proc.returncode, "stderr": err, "workers_gone": gone,
            "meta": json.loads((run / META_FILE).read_text()), "rows": len(_lines(run))}


def test_sigterm_stops_a_tune_as_interrupted_with_exit_status_143(stopped):
    assert stopped["rc"] == 143, stopped["stderr"]
    assert stopped["meta"]["status"] == "interrupted" and stopped["meta"]["stopped_by"] == "SIGTERM"
    assert f"interrupted: rows so far in {stopped['run']}; run the same command to resume" in stopped["stderr"]
    assert "Traceback" not in stopped["stderr"]
    assert stopped["workers_gone"]


def test_a_resumed_tune_cuts_a_torn_last_row_off_with_a_warning_and_sums_its_wall_time(stopped):
    run, kept = stopped["run"], stopped["rows"]
    with open(run / ROWS_FILE, "a") as f:
        f.write('{"model": "ti')  # a row cut short as the process stopped
    before = _lines(run)[:kept]
    done = _run(stopped["out"], "1")
    warning = f"line {kept + 1} is cut short"
    assert warning in done.stderr
    assert "export" not in done.stderr  # an interpreter run: export-configs refuses its rows, so no hint
    meta, df = load_run(run)
    resumed = meta["resumed"][-1]
    assert resumed["previous_status"] == "interrupted" and resumed["rows_kept"] == kept
    assert any(warning in w for w in resumed["warnings"])
    assert df.attrs["warnings"] == [] and meta["status"] == "complete"
    assert _lines(run)[:kept] == before
    # the wall time is both starts', said in the closing line too
    first, last = meta["wall_s_by_start"]
    assert first == stopped["meta"]["wall_s"] and meta["wall_s"] == round(first + last, 1)
    assert f"s; {meta['wall_s']:.0f} s over its 2 starts)" in done.stderr
    keys = _keys(run)
    assert [k for k, n in Counter(keys).items() if n > (CHECK_PASSES if k[-1] == "default" else 1)] == []
    assert {phase for _, _, phase in keys} == {"screen", "final", "default"}
