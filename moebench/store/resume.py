"""Resuming a stopped run, and the signals that stop one.

The same request started again (``request_key``: what the run is asked to do, as a short hash) finds its
stopped folder (``find_resumable``) and reopens it (``runfolder.RunWriter(..., resume=True)``): the rows
already there (``row_identity``) are kept and only the rest are run. Ctrl-C and SIGTERM (``stop_on_sigterm``)
stop a run as an ``Interrupted`` that names its folder, so the writer records "interrupted" and the command
says how to resume.
"""

from __future__ import annotations

import hashlib
import json
import platform
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from moebench.bounded import read_json
from moebench.errors import UserError
from moebench.store.runfolder import META_FILE, ROWS_FILE, run_status

# What a row is a measurement of: its point and (below) its tile config. Two rows with one identity are one
# measurement twice; a resumed run skips the identities its folder has.
IDENTITY_COLUMNS = ("model", "experts", "hidden", "intermediate", "topk", "dtype", "M", "path", "routing", "seed")
# Columns added since, part of the identity only where a row sets them: a row without them (every row written
# before they existed) keeps its identity, and a stopped run its request key.
SET_IDENTITY_COLUMNS = ("global_experts",)


def row_identity(row: dict) -> tuple:
    """The identity of a row (a dict as written to rows.jsonl, or as ``Row.as_dict`` gives it): the values of
    ``IDENTITY_COLUMNS``, the tile config as canonical JSON (None where the path has none), then (name, value)
    of each of ``SET_IDENTITY_COLUMNS`` the row sets."""
    config = row.get("config")
    extra = tuple((c, row[c]) for c in SET_IDENTITY_COLUMNS if _is_set(row.get(c)))
    return (*(row.get(c) for c in IDENTITY_COLUMNS), None if config is None else json.dumps(config, sort_keys=True),
            *extra)


def _is_set(value) -> bool:
    """Neither None nor NaN (a missing value of a DataFrame's column)."""
    return value is not None and value == value


def request_key(obj) -> str:
    """A short stable name of what a run is asked to do: 12 hex digits of the SHA-256 of ``obj`` (plain data)
    as canonical JSON. The caller leaves out what does not change the rows: the output folder, progress."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _last_written(run_dir: Path) -> int:
    return max((p.stat().st_mtime_ns for p in (run_dir / META_FILE, run_dir / ROWS_FILE) if p.exists()), default=0)


def _runs_of(out_base: Path, key: str) -> list[tuple[int, str, Path, dict]]:
    """The run folders under ``out_base`` of the request ``key``: (last written, name, folder, meta) each."""
    found = []
    for meta_path in Path(out_base).glob(f"*/{META_FILE}"):
        try:
            meta = read_json(meta_path, gz=False)
        except UserError:
            continue  # not a run folder of any request
        if isinstance(meta, dict) and meta.get("request") == key:
            found.append((_last_written(meta_path.parent), meta_path.parent.name, meta_path.parent, meta))
    return found


def find_resumable(out_base: Path, key: str) -> Path | None:
    """The run folder under ``out_base`` that a new start of the request ``key`` continues: the newest folder
    of that request (the last written), unless it is complete (the request ran through; a new start is a new
    run). UserError where that folder's process still runs on this host: it owns the folder."""
    found = _runs_of(out_base, key)
    if not found:
        return None
    *_, run_dir, meta = max(found, key=lambda f: f[:2])
    status = run_status(meta)
    if status == "complete":
        return None
    if status == "running" and meta.get("host") == platform.node():
        raise UserError(f"{run_dir} is being written by process {meta.get('pid')} on this machine; "
                        "wait for it or stop it (--fresh starts a new folder)")
    return run_dir


def newest_complete(out_base: Path, key: str) -> Path | None:
    """The newest run folder under ``out_base`` of the request ``key`` that ran through (status complete), or
    None: what a caller that needs only a finished run's result reads instead of running it again."""
    done = [f for f in _runs_of(out_base, key) if run_status(f[3]) == "complete"]
    return max(done, key=lambda f: f[:2])[2] if done else None


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopping a run: the signal's name and, once the run has a folder, the folder. A
    KeyboardInterrupt, so ``finally`` blocks run and the writer records "interrupted"."""

    def __init__(self, signal_name: str = "SIGINT", run_dir: Path | None = None):
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.run_dir = run_dir

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a process that signal ended: 130, 143."""
        return 128 + signal.Signals[self.signal_name].value


def stopped_in(e: BaseException, run_dir: Path) -> BaseException:
    """What to raise for a run in ``run_dir`` that ``e`` stopped: Ctrl-C or SIGTERM as an ``Interrupted`` that
    names the folder (the line ``cli.main`` prints tells how to resume it); any other exception as it is."""
    if isinstance(e, Interrupted):
        e.run_dir = run_dir
        return e
    if isinstance(e, KeyboardInterrupt):  # Ctrl-C: Python's own KeyboardInterrupt
        return Interrupted("SIGINT", run_dir)
    return e


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Interrupted("SIGTERM")`` in the main thread; a repeat while the run
    records its end is ignored, and the previous handler is back after the block. Off the main thread (where
    no handler can be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Interrupted("SIGTERM")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
