"""Files written whole or not at all: a temporary file in the same folder, then a rename.

Every file moebench writes for people or programs to read back (meta.json, tables, pages) goes through
here, so a run stopped mid-write leaves the old file or the new one, never half of one. Files that belong
together (an export's tables and their sidecar) are written as one (``write_files_atomic``). Rows are appended
a whole line at a time (``AppendLines``). An OSError raised here names the file it was writing: a full disk's
``No space left on device`` names none by itself.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def naming(path: Path, *also: Path) -> Iterator[None]:
    """An OSError raised within names ``path`` where it names no file, or names one of ``also`` (temporary
    files the user never asked for): ``cli.main`` prints it as ``<path>: <why>``."""
    try:
        yield
    except OSError as e:
        if e.filename is None or str(e.filename) in {str(p) for p in also}:
            if e.errno is None:  # no errno to build one from: named in place
                e.filename = str(path)
                raise
            # a new one: ``e.filename2 = None`` would read "-> None" in its message
            raise type(e)(e.errno, e.strerror, str(path)) from e
        raise


def _temp_name(path: Path) -> Path:
    return path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _write_temp(path: Path, text: str) -> Path:
    """``text`` in a new temporary file beside ``path``; its name. Nothing is left where it fails.

    The temp file is created with the permissions of any new file (0666 less the umask), not the 0600 of
    ``tempfile``, so the renamed file reads like one written in place.
    """
    tmp = _temp_name(path)
    with naming(path, tmp):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return tmp


def _make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and the folders above it that are missing; those created, outermost first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()][::-1]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temp file in the same folder (created if missing), then rename: no reader sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temp(path, text)
    try:
        with naming(path, tmp):
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj) -> None:
    """``obj`` as indented JSON, written atomically (``write_text_atomic``)."""
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


def overwrite_in_place(path: Path, text: str) -> bool:
    """Overwrite ``path`` in place with ``text`` where the file is at least as long: its own blocks take it, so
    it fits where a full disk refuses a temporary file. Not atomic (a stop mid-write tears it): the last resort
    when ``write_text_atomic`` fails for space. False, and the file untouched, where ``text`` is longer; an
    OSError names ``path``."""
    path, data = Path(path), memoryview(text.encode("utf-8"))
    with naming(path):
        fd = os.open(path, os.O_WRONLY)
        try:
            if len(data) > os.fstat(fd).st_size:
                return False
            at = 0
            while at < len(data):
                at += os.pwrite(fd, data[at:], at)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
    return True


def write_files_atomic(texts: Mapping[Path, str]) -> None:
    """Write several files as one, in the order given: every text to a temp file beside its path, then each
    renamed into place. Where anything fails, every file is as it was (a new one absent, a replaced one back)
    and the folders this created are gone; the OSError names the file it was writing."""
    made: list[Path] = []  # folders created, outermost first
    temps: dict[Path, Path] = {}  # path -> its new text, not yet in place
    saved: dict[Path, Path] = {}  # path -> a hard link to the file it had, until all are in place
    placed: list[Path] = []
    try:
        for path, text in texts.items():
            path = Path(path)
            with naming(path):
                made += _make_folders(path.parent)
            temps[path] = _write_temp(path, text)
        for path, tmp in temps.items():
            with naming(path, tmp):
                if path.exists():
                    saved[path] = _temp_name(path)
                    os.link(path, saved[path])
                os.replace(tmp, path)
            placed.append(path)
    except BaseException:
        for path in reversed(placed):
            if path in saved:
                os.replace(saved.pop(path), path)
            else:
                path.unlink(missing_ok=True)
        for p in (*temps.values(), *saved.values()):
            p.unlink(missing_ok=True)
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass
        raise
    for p in saved.values():
        p.unlink(missing_ok=True)


class AppendLines:
    """A file that takes whole lines at the end (a run's rows.jsonl), each written straight to the file (no
    buffer). A line that fails part-way is cut off again, so the file ends in a whole line, the space it took is
    free for meta.json to record the failure, and ``close`` has nothing left to write; the OSError names the file.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        with naming(self.path):
            self._f = open(self.path, "ab", buffering=0)

    def write(self, text: str) -> None:
        data = memoryview(text.encode("utf-8"))
        end = os.fstat(self._f.fileno()).st_size
        try:
            with naming(self.path):
                while data:
                    data = data[self._f.write(data):]
        except OSError:
            try:
                os.ftruncate(self._f.fileno(), end)
            except OSError:
                pass  # the torn line stays: a reader leaves it out, a resumed run cuts it off
            raise

    def flush(self) -> None:
        """Nothing to do: every line is written when it is given."""

    def close(self) -> None:
        self._f.close()
