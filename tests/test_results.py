"""Run folders on disk: atomic writes with ordinary permissions, torn rows, output folders that cannot be."""

from __future__ import annotations

import errno
import gzip
import json
import os

import pytest

from moebench.errors import UserError, os_error_line
from moebench.store.atomic import write_text_atomic
from moebench.store.rows import Row
from moebench.store.runfolder import META_FILE, ROWS_FILE, ensure_out_dir, load_run

ROW = Row(model="tiny", experts=8, hidden=64, intermediate=32, topk=2, moe_layers=1, M=1, dtype="fp16",
          path="torch", routing="uniform", seed=0).as_dict()


def _line(m: int) -> str:
    """One row of rows.jsonl, at M = ``m``, with its newline."""
    return json.dumps({**ROW, "M": m}) + "\n"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_atomic_write_gives_a_new_files_permissions_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "meta.json"
    write_text_atomic(path, "{}\n")
    assert path.read_text() == "{}\n"
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()  # not tempfile's 0600
    assert [p.name for p in path.parent.iterdir()] == ["meta.json"]


def test_atomic_write_that_fails_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text("old\n")
    with pytest.raises(TypeError):
        write_text_atomic(path, b"not text")  # type: ignore[arg-type]
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["meta.json"]


def _run(tmp_path, rows_text: str):
    run = tmp_path / "run"
    run.mkdir(parents=True)
    (run / META_FILE).write_text(json.dumps({"schema_version": 1}))
    (run / ROWS_FILE).write_text(rows_text)
    return run


def test_a_torn_last_row_is_left_out_with_a_warning(tmp_path):
    """The line a killed run was writing has no newline after it: the rows before it load."""
    _, df = load_run(_run(tmp_path, _line(1) + _line(2) + '{"M": 3, "pa'))
    assert df["M"].tolist() == [1, 2]
    (warning,) = df.attrs["warnings"]
    assert "line 3 is cut short" in warning
    _, whole = load_run(_run(tmp_path / "b", _line(1)))
    assert whole.attrs["warnings"] == []


def test_a_committed_run_with_gzipped_rows_loads_as_it_is(tmp_path):
    """rows.jsonl.gz stands in for rows.jsonl (committed runs keep their rows compressed); damage is one line."""
    run = _run(tmp_path, "")
    (run / ROWS_FILE).unlink()
    (run / (ROWS_FILE + ".gz")).write_bytes(gzip.compress((_line(1) + _line(2)).encode()))
    _, df = load_run(run)
    assert df["M"].tolist() == [1, 2]
    (run / (ROWS_FILE + ".gz")).write_bytes(b"plain text, not gzip")
    with pytest.raises(UserError, match="rows.jsonl.gz: not gzip"):
        load_run(run)


@pytest.mark.parametrize("text, fragment", [
    (_line(1) + '{"M": 2, "pa\n' + _line(3), "line 2 is not JSON"),  # damage inside the file is not a torn end
    (_line(1) + "[1, 2]\n", "line 2 is not a JSON object"),
])
def test_a_damaged_row_inside_the_file_is_an_error_naming_its_line(tmp_path, text, fragment):
    with pytest.raises(UserError, match=fragment):
        load_run(_run(tmp_path, text))


def test_a_folder_holding_run_folders_names_them(tmp_path):
    inner = _run(tmp_path, "")
    with pytest.raises(UserError, match=f"not a moebench run folder.*run folders inside it: {inner.name}"):
        load_run(tmp_path)


def test_an_output_folder_that_is_a_file_fails_before_any_work(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("")
    for out in (taken, taken / "runs"):
        with pytest.raises(OSError) as info:
            ensure_out_dir(out)
        assert os_error_line(info.value) == f"{out}: a file is in the way where a folder is needed"
    assert ensure_out_dir(tmp_path / "new" / "runs").is_dir()


@pytest.mark.parametrize("error, line", [
    (OSError(errno.EROFS, os.strerror(errno.EROFS), "/mnt/ro/runs"), f"/mnt/ro/runs: {os.strerror(errno.EROFS)}"),
    (PermissionError(errno.EACCES, "Permission denied", "/x"), "/x: Permission denied"),
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),  # no file named
])
def test_os_errors_read_as_one_line(error, line):
    assert os_error_line(error) == line


def test_an_output_folder_that_takes_no_files_fails_before_any_work(tmp_path, monkeypatch):
    """A read-only folder (as a user other than root meets one: access says no) is refused up front."""
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(PermissionError) as info:
        ensure_out_dir(tmp_path)
    assert os_error_line(info.value) == f"{tmp_path}: cannot create files in this folder"
