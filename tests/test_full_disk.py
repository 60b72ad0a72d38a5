"""A full disk: the one line names the file that could not be written, the run folder records the failure where
meta.json can still be written (over itself in place where no temporary file fits), and a file is written whole or
not at all. Writes fail by monkeypatching: the rows file opens on a disk with a few hundred bytes left; the atomic
write raises ENOSPC."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest
from helpers import moebench_in_process

from moebench.store import atomic
from moebench.store.runfolder import RunWriter, load_run, run_status

SWEEP = ("sweep", "--model", "tiny", "--m", "1,2,3", "--dtype", "fp16", "--path", "torch", "--no-progress")


def _enospc(filename: str | None = None) -> OSError:
    """What a write on a full disk raises: no filename, unless ``filename`` is given."""
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([filename] if filename else []))


def _disk_with_room(monkeypatch, room: int) -> None:
    """Files ``store.atomic`` opens (the rows file) take ``room`` bytes in all, then raise ENOSPC naming no file;
    a write that reaches the limit writes what fits first, as a real one does."""
    left = {"room": room}

    class Full(io.FileIO):
        def write(self, b) -> int:
            if left["room"] <= 0:
                raise _enospc()
            n = min(len(b), left["room"])
            left["room"] -= n
            return super().write(bytes(b[:n]))

    monkeypatch.setattr(atomic, "open", lambda path, mode, buffering=-1: Full(path, mode), raising=False)


def _errors(result) -> list[str]:
    """The lines of stderr that say something went wrong (the interpreter's note aside), no traceback."""
    assert "Traceback" not in result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("error")]


def _only_run(results: Path) -> Path:
    (run,) = list(results.iterdir())
    return run


def test_a_sweep_on_a_full_disk_names_the_rows_file_and_records_the_failure(tmp_path, monkeypatch):
    """The second row does not fit: one line naming rows.jsonl, exit 2; meta.json says failed with that error
    (not "running", which reads back as killed), and rows.jsonl ends in the first row, whole."""
    _disk_with_room(monkeypatch, 1000)  # one row of the tiny sweep (about 750 bytes) and part of the next
    r = moebench_in_process(*SWEEP, "--out", str(tmp_path / "results"), cwd=tmp_path)
    run = _only_run(tmp_path / "results")
    rows_file = run / "rows.jsonl"
    assert r.returncode == 2
    assert _errors(r) == [f"error: {rows_file}: No space left on device"]
    meta, df = load_run(run)
    assert meta["status"] == "failed" and run_status(meta) == "failed"
    assert str(rows_file) in meta["error"] and "No space left on device" in meta["error"]
    text = rows_file.read_text()
    assert text.endswith("\n") and 1 <= len(df) < 3 and df.attrs["warnings"] == []


def _no_temp_for_meta(monkeypatch) -> None:
    """meta.json's temporary file for the run's end cannot be written: its atomic write raises ENOSPC."""
    import moebench.store.runfolder as runfolder

    def full(path, obj):
        assert obj.get("status") != "running"  # the precondition: the end's write, not a running run's
        raise _enospc(str(path))
    monkeypatch.setattr(runfolder, "write_json_atomic", full)


def test_where_meta_json_gets_no_temp_file_the_failure_is_written_over_it_in_place(tmp_path, monkeypatch):
    """The disk stays full for meta.json's temporary file too: the line still names rows.jsonl (the write that
    failed first), and meta.json, overwritten in place, reads back failed with that error, not killed."""
    _disk_with_room(monkeypatch, 1000)
    _no_temp_for_meta(monkeypatch)
    r = moebench_in_process(*SWEEP, "--out", str(tmp_path / "results"), cwd=tmp_path)
    run = _only_run(tmp_path / "results")
    assert r.returncode == 2
    assert _errors(r) == [f"error: {run / 'rows.jsonl'}: No space left on device"]
    meta, _ = load_run(run)
    assert run_status(meta) == "failed" and meta["error"].endswith(f"No space left on device: '{run / 'rows.jsonl'}'")
    assert sorted(p.name for p in run.iterdir()) == ["meta.json", "rows.jsonl"]  # no temp file left


def test_a_complete_run_whose_meta_gets_no_temp_file_still_reads_back_complete(tmp_path, monkeypatch):
    """Every row fits but meta.json's temporary file does not: the end is written in place, exit 0."""
    _no_temp_for_meta(monkeypatch)
    r = moebench_in_process(*SWEEP, "--out", str(tmp_path / "results"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    meta, df = load_run(_only_run(tmp_path / "results"))
    assert run_status(meta) == "complete" and len(df) == 3 and meta["wall_s"] >= 0


def test_an_end_too_long_for_meta_json_keeps_its_status_and_reason(tmp_path, monkeypatch):
    """The end's extra entries are left out so that its status, time and reason fit the file's size."""
    run = tmp_path / "run"
    writer = RunWriter(run, {"request": "abc"})
    size = (run / "meta.json").stat().st_size
    _no_temp_for_meta(monkeypatch)
    writer.end(RuntimeError("x" * size), pruned={str(m): {"rule": m} for m in range(size)})
    meta = json.loads((run / "meta.json").read_text())
    assert (run / "meta.json").stat().st_size <= size
    assert meta["status"] == "failed" and "pruned" not in meta and meta["error"].startswith("RuntimeError: xxx")
    assert meta["request"] == "abc" and meta["pid"] == os.getpid() and meta["finished"]


def test_overwrite_in_place_refuses_a_longer_text_and_leaves_the_file(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text("0123456789")
    assert not atomic.overwrite_in_place(path, "0123456789+")
    assert path.read_text() == "0123456789"
    assert atomic.overwrite_in_place(path, "short") and path.read_text() == "short"


@pytest.mark.parametrize("fail", ["write", "replace"])
def test_an_atomic_write_that_fails_names_its_file_and_leaves_the_old_one(tmp_path, monkeypatch, fail):
    """The temp file's write, or its rename, raises ENOSPC naming no file: the error names the file being
    written (not the temp), the old text stays, and no temp file is left."""
    path = tmp_path / "meta.json"
    path.write_text("old\n")
    if fail == "replace":
        monkeypatch.setattr(atomic.os, "replace", lambda src, dst: (_ for _ in ()).throw(_enospc()))
    else:
        real = os.fdopen

        def full_fdopen(fd, *a, **kw):
            f = real(fd, *a, **kw)
            f.write = lambda text: (_ for _ in ()).throw(_enospc())
            return f
        monkeypatch.setattr(atomic.os, "fdopen", full_fdopen)
    with pytest.raises(OSError) as e:
        atomic.write_text_atomic(path, "new\n")
    assert e.value.filename == str(path) and e.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"]


def test_files_written_together_are_all_written_or_none(tmp_path, monkeypatch):
    """The third rename fails: the first file (new) is gone again, the second (replaced) has its old text, the
    folder this made is removed, no temp or saved link is left."""
    kept = tmp_path / "b.json"
    kept.write_text("old b\n")
    texts = {tmp_path / "new" / "a.json": "a\n", kept: "new b\n", tmp_path / "c.json": "c\n"}
    real, calls = os.replace, []

    def third_fails(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise _enospc()
        real(src, dst)
    monkeypatch.setattr(atomic.os, "replace", third_fails)
    with pytest.raises(OSError) as e:
        atomic.write_files_atomic(texts)
    monkeypatch.undo()
    assert e.value.filename == str(tmp_path / "c.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"] and kept.read_text() == "old b\n"
    atomic.write_files_atomic(texts)  # and where nothing fails, all are there
    assert [p.read_text() for p in texts] == ["a\n", "new b\n", "c\n"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.json", "b.json", "c.json", "new"]
