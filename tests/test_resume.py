"""Stopped runs resume: a killed or interrupted sweep started again continues in its folder, no row lost or
run twice; the folder's status says how it stopped; torn rows, other requests and live owners are handled."""

from __future__ import annotations

import calendar
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moebench._interpret import interpreting
from moebench.bench.spec import Block, SweepSpec
from moebench.bench.sweep import SweepPlan, run_sweep, sweep_request
from moebench.errors import UserError
from moebench.models import get_model
from moebench.paths.base import Target
from moebench.problem import Problem
from moebench.store.atomic import write_json_atomic
from moebench.store.resume import Interrupted, find_resumable, request_key, row_identity, stop_on_sigterm
from moebench.store.rows import Row
from moebench.store.runfolder import META_FILE, ROWS_FILE, RunWriter, load_run, run_status, status_warning

ROOT = Path(__file__).resolve().parent.parent
TINY = get_model("tiny")


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped): what a SIGKILLed run leaves in its meta."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _row(m: int) -> dict:
    return Row.for_point(Problem(TINY, m, "fp16"), "torch", Target.current()).as_dict()


def _killed_run(tmp_path: Path, rows_text: str = "") -> Path:
    """A run folder as SIGKILL leaves one: status running, its process gone, the rows written so far."""
    run = tmp_path / "run"
    writer = RunWriter(run, {"request": "abc"})
    for m in (1, 2):
        writer.append(_row(m))
    writer.end()
    meta = {k: v for k, v in json.loads((run / META_FILE).read_text()).items() if k != "finished"}
    write_json_atomic(run / META_FILE, {**meta, "status": "running", "pid": _dead_pid()})
    with open(run / ROWS_FILE, "a") as f:
        f.write(rows_text)
    return run


def test_a_torn_last_row_is_cut_off_on_resume_with_a_warning(tmp_path):
    run = _killed_run(tmp_path, '{"model": "ti')
    writer = RunWriter(run, {"request": "abc"}, resume=True)
    assert [r["M"] for r in writer.kept] == [1, 2]
    (warning,) = writer.warnings
    assert "line 3 is cut short" in warning
    assert writer.resumed["warnings"] == [warning] and writer.resumed["previous_status"] == "killed"
    writer.append(_row(3))  # appended on a line of its own, not onto the torn bytes
    writer.end()
    meta, df = load_run(run)
    assert df["M"].tolist() == [1, 2, 3] and df.attrs["warnings"] == []
    assert meta["status"] == "complete" and meta["pid"] == os.getpid() and meta["resumed"][0]["rows_kept"] == 2


def test_a_last_row_whole_but_for_its_newline_is_kept(tmp_path):
    run = _killed_run(tmp_path, json.dumps(_row(3)))
    writer = RunWriter(run, {"request": "abc"}, resume=True)
    assert [r["M"] for r in writer.kept] == [1, 2, 3] and writer.warnings == []
    writer.append(_row(4))
    writer.end()
    assert load_run(run)[1]["M"].tolist() == [1, 2, 3, 4]


def test_the_wall_time_of_a_resumed_run_sums_its_starts(tmp_path):
    """Three starts: interrupted after 5 s, killed 7 s after it began (counted to its last row), then complete
    after 2 s: meta.json's wall_s is the 14 s of all three, wall_s_by_start each start's."""
    run = tmp_path / "run"
    first = RunWriter(run, {"request": "abc"})
    first.append(_row(1))
    first.end(KeyboardInterrupt(), wall_s=5.0)
    second = RunWriter(run, {"request": "abc"}, resume=True)
    second.append(_row(2))
    meta = json.loads((run / META_FILE).read_text())  # what SIGKILL leaves: running, its process gone
    meta["resumed"][-1]["at"] = "2024-01-01T00:00:00Z"
    write_json_atomic(run / META_FILE, {**meta, "pid": _dead_pid()})
    last_row = calendar.timegm(time.strptime("2024-01-01T00:00:07", "%Y-%m-%dT%H:%M:%S"))
    for p in (run / ROWS_FILE, run / META_FILE):
        os.utime(p, (last_row, last_row))
    third = RunWriter(run, {"request": "abc"}, resume=True)
    assert third.resumed["previous_status"] == "killed"
    third.end(wall_s=2.0)
    meta = json.loads((run / META_FILE).read_text())
    assert meta["wall_s_by_start"] == [5.0, 7.0, 2.0] and meta["wall_s"] == 14.0


def _folder(base: Path, name: str, age_s: float, **meta) -> Path:
    """A run folder under ``base`` with ``meta``, last written ``age_s`` seconds ago."""
    run = base / name
    run.mkdir(parents=True)
    write_json_atomic(run / META_FILE, {"host": platform.node(), **meta})
    (run / ROWS_FILE).write_text("")
    stamp = time.time() - age_s
    for p in run.iterdir():
        os.utime(p, (stamp, stamp))
    return run


def test_find_resumable_takes_the_newest_stopped_run_of_the_request(tmp_path):
    """Other requests and complete runs are not resumed; a killed or interrupted run of the request is."""
    assert find_resumable(tmp_path / "none", "abc") is None
    _folder(tmp_path, "a-complete", 300, request="abc", status="complete")
    _folder(tmp_path, "b-other-request", 10, request="xyz", status="running", pid=_dead_pid())
    assert find_resumable(tmp_path, "abc") is None
    interrupted = _folder(tmp_path, "c-interrupted", 200, request="abc", status="interrupted")
    assert find_resumable(tmp_path, "abc") == interrupted
    killed = _folder(tmp_path, "d-killed", 100, request="abc", status="running", pid=_dead_pid())
    assert find_resumable(tmp_path, "abc") == killed


def test_a_request_that_last_ran_through_starts_a_new_run(tmp_path):
    """An older stopped folder is not taken up once a newer run of the request completed (say with --fresh)."""
    _folder(tmp_path, "a-failed", 200, request="abc", status="failed", error="RuntimeError: x")
    _folder(tmp_path, "b-complete", 100, request="abc", status="complete")
    assert find_resumable(tmp_path, "abc") is None


def test_a_folder_its_live_process_writes_is_refused(tmp_path):
    run = _folder(tmp_path, "live", 0, request="abc", status="running", pid=os.getpid())
    with pytest.raises(UserError, match=f"{run} is being written by process {os.getpid()}"):
        find_resumable(tmp_path, "abc")


def test_a_running_folder_of_another_host_cannot_be_checked_and_is_resumed(tmp_path):
    run = _folder(tmp_path, "elsewhere", 0, request="abc", status="running", pid=os.getpid(), host="not-this-one")
    assert run_status(json.loads((run / META_FILE).read_text())) == "running"
    assert find_resumable(tmp_path, "abc") == run


def test_the_request_changes_with_m_and_not_between_builds():
    def key(ms):
        spec = SweepSpec("t", (Block((TINY,), ms, ("fp16",), ("torch",)),))
        return request_key(sweep_request(SweepPlan.build(spec, Target.current())))

    assert key((1, 2)) == key((1, 2)) and key((1, 2)) != key((1, 3))


def test_sigterm_in_the_block_raises_interrupted_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as info, stop_on_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert info.value.signal_name == "SIGTERM" and info.value.exit_status == 143
    assert signal.getsignal(signal.SIGTERM) == before


def test_an_interrupted_sweep_resumes_with_only_the_rows_left(tmp_path):
    """Ctrl-C after the first row: the folder says interrupted by SIGINT; the same sweep again runs the one row
    left (on_start is told 1), and the folder ends complete with each row once."""
    spec = SweepSpec("t", (Block((TINY,), (1, 2), ("fp16",), ("torch",)),))

    def ctrl_c(row):
        raise KeyboardInterrupt

    with pytest.raises(Interrupted) as info:
        run_sweep(spec, tmp_path, on_row=ctrl_c)
    run = info.value.run_dir
    meta, df = load_run(run)
    assert (meta["status"], meta["stopped_by"], len(df), info.value.exit_status) == ("interrupted", "SIGINT", 1, 130)
    assert status_warning(meta, "x", len(df)) == "run x: interrupted by SIGINT (rows kept: 1)"
    starts, resumes = [], []
    again = run_sweep(spec, tmp_path, on_start=starts.append, on_resume=lambda d, r: resumes.append((d, r)))
    assert again == run and starts == [1] and list(tmp_path.iterdir()) == [run]
    ((where, record),) = resumes
    assert where == run and (record["previous_status"], record["rows_kept"]) == ("interrupted", 1)
    meta, df = load_run(run)
    assert meta["status"] == "complete" and "stopped_by" not in meta and sorted(df["M"]) == [1, 2]


def test_a_sweep_that_raises_is_marked_failed_and_fresh_starts_a_new_folder(tmp_path):
    spec = SweepSpec("t", (Block((TINY,), (1, 2), ("fp16",), ("torch",)),))

    def broken(row):
        raise RuntimeError("disk on fire\nsecond line")

    with pytest.raises(RuntimeError):
        run_sweep(spec, tmp_path, on_row=broken)
    (run,) = tmp_path.iterdir()
    meta = json.loads((run / META_FILE).read_text())
    assert meta["status"] == "failed" and meta["error"] == "RuntimeError: disk on fire"
    fresh = run_sweep(spec, tmp_path, resume=False)
    assert fresh != run and len(load_run(fresh)[1]) == 2


def test_a_garbage_line_inside_the_rows_stops_a_resume_saying_what_to_do(tmp_path):
    """A damaged line that is not the last (not a torn end) cannot be cut off: the resume stops in one line
    naming the file and line, and the ways forward (remove it, or --fresh) both work."""
    spec = SweepSpec("t", (Block((TINY,), (1, 2, 3), ("fp16",), ("torch",)),))
    seen = []

    def stop_after_two(row):
        seen.append(row)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as info:
        run_sweep(spec, tmp_path, on_row=stop_after_two)
    run = info.value.run_dir
    rows = run / ROWS_FILE
    first, second = rows.read_text().splitlines()
    rows.write_text(f"{first}\nnot json at all\n{second}\n")
    with pytest.raises(UserError) as refused:
        run_sweep(spec, tmp_path)
    assert str(refused.value) == (f"{rows}: line 2 is not JSON (Expecting value); cannot resume: remove line 2 of "
                                  f"{rows} to keep the other rows, or start a new run folder with --fresh")
    assert run_sweep(spec, tmp_path, resume=False) != run  # --fresh
    rows.write_text(f"{first}\n{second}\n")  # the line removed
    assert run_sweep(spec, tmp_path) == run and sorted(load_run(run)[1]["M"]) == [1, 2, 3]


# --- the command line, killed for real (CPU: the interpreter's rows take long enough to stop a run between) ---

SWEEP = ("sweep", "--model", "tiny", "--m", "1,2,3", "--dtype", "fp16", "--path", "triton", "--no-progress")


def _start(out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "moebench", *SWEEP, "--out", str(out), *extra], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop_after(proc: subprocess.Popen, out: Path, rows: int, sig: signal.Signals) -> tuple[int, str]:
    """Send ``sig`` once the run folder under ``out`` holds ``rows`` rows; (exit status, stderr)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        files = list(out.glob(f"*/{ROWS_FILE}"))
        if files and files[0].read_text().count("\n") >= rows:
            proc.send_signal(sig)
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.skipif(not interpreting(), reason="stops a run between rows: the interpreter's rows take seconds")
def test_a_sweep_stopped_by_sigterm_then_sigkill_completes_like_an_uninterrupted_one(tmp_path):
    ref_out, out = tmp_path / "ref", tmp_path / "out"
    ref = _start(ref_out, "--format", "json")  # output format and progress flags are not part of the request
    _, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, err
    (ref_run,) = ref_out.iterdir()
    ref_meta, ref_df = load_run(ref_run)

    code, err = _stop_after(_start(out), out, 1, signal.SIGTERM)
    (run,) = out.iterdir()
    meta, df = load_run(run)
    assert code == 143 and "Traceback" not in err, err
    assert _lines(err)[-1] == f"interrupted: rows so far in {run}; run the same command to resume"
    assert (meta["status"], meta["stopped_by"]) == ("interrupted", "SIGTERM") and 1 <= len(df) < 3
    kept_after_term = len(df)

    code, err = _stop_after(_start(out), out, kept_after_term + 1, signal.SIGKILL)
    meta, df = load_run(run)
    assert code == -signal.SIGKILL and meta["status"] == "running"  # killed part-way, nothing recorded the end
    assert run_status(meta) == "killed" and len(df) < 3
    assert status_warning(meta, str(run), len(df)) == f"run {run}: killed (rows kept: {len(df)})"
    kept_after_kill = len(df)

    done = _start(out)
    _, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    assert f"resuming {run}: {kept_after_kill} rows kept (previous status: killed)" in err
    assert list(out.iterdir()) == [run]
    meta, df = load_run(run)
    identities = [row_identity(r) for r in df.to_dict("records")]
    assert len(set(identities)) == len(identities) == 3
    assert sorted(identities, key=repr) == sorted((row_identity(r) for r in ref_df.to_dict("records")), key=repr)
    assert meta["status"] == "complete" and meta["request"] == ref_meta["request"]
    assert [(r["previous_status"], r["rows_kept"]) for r in meta["resumed"]] == [
        ("interrupted", kept_after_term), ("killed", kept_after_kill)]


@pytest.mark.parametrize("raised, status", [(None, "complete"), (KeyboardInterrupt(), "interrupted"),
                                            (RuntimeError("boom"), "failed")])
def test_a_writer_used_as_a_context_ends_the_run_as_its_block_ended(tmp_path, raised, status):
    """``with writer:`` (retime, merge, fit-time) records complete, interrupted or failed and lets the exception
    through, as ``end(stopped)`` in a try/finally did."""
    def block():
        with RunWriter(tmp_path / "run", {"sweep": "t"}):
            if raised is not None:
                raise raised

    if raised is None:
        block()
    else:
        with pytest.raises(type(raised)):
            block()
    meta = json.loads((tmp_path / "run" / META_FILE).read_text())
    assert meta["status"] == status and (status != "failed" or "boom" in meta["error"])
