"""Run folders: create one, append its rows, reopen a stopped one, read one back.

A run folder holds ``meta.json`` (schema version, machine, versions, command
line, ceilings, timing method, status, the request's key, the writing process)
and ``rows.jsonl`` (one JSON object per row, appended as each finishes, so a
killed run keeps what it measured). ``RunWriter`` creates a folder or reopens a
stopped one (``resume``: a torn last row is cut off, the rows there are kept);
``load_run`` reads a folder back into a pandas DataFrame, rows.jsonl.gz as well
(committed runs keep their rows compressed). Which folder a new start resumes,
and the signals that stop a run, are ``store.resume``'s.
"""

from __future__ import annotations

import calendar
import errno
import json
import math
import os
import platform
import time
from pathlib import Path

import pandas as pd

from moebench.bounded import NotJSON, Refused, parse_json, read_bytes, read_json, read_text
from moebench.errors import UserError, one_line
from moebench.filenames import check_part
from moebench.store.atomic import AppendLines, overwrite_in_place, write_json_atomic, write_text_atomic
from moebench.store.rows import Row, check_meta, check_row

SCHEMA_VERSION = 1
META_FILE = "meta.json"
ROWS_FILE = "rows.jsonl"

# Columns every row carries, in this order (csv/json output and readers rely on them): the fields of Row.
ROW_COLUMNS = Row.columns()


# ---- writing -------------------------------------------------------------------------------------------

def ensure_out_dir(base: Path) -> Path:
    """Create ``base``, the folder run folders go in, and check it takes new files; OSError where it cannot.

    Called before a run starts, so an ``--out`` that is a file or read-only fails before any work.
    """
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    if not os.access(base, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "cannot create files in this folder", str(base))
    return base


def check_out_dir(folder: Path, flag: str = "--out") -> None:
    """Check, creating nothing, that ``folder`` can be made and take files: not a file in the way, and its
    nearest existing folder takes new files; UserError (one line, naming ``flag``) where not. Commands call it
    before their work so a refusal leaves no folder; ``ensure_out_dir`` creates it when the work starts."""
    full = Path(folder).absolute()
    existing = next(p for p in (full, *full.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"{flag} {folder}: a file is in the way ({existing})")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {folder}: cannot create files in {existing}")


def new_run_dir(base: Path, name: str) -> Path:
    """A fresh folder name under ``base`` (not created): ``<UTC time>-<name>``."""
    check_part(name, "a run folder's name:")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    candidate = Path(base) / f"{stamp}-{name}"
    n = 1
    while candidate.exists():
        n += 1
        candidate = Path(base) / f"{stamp}-{name}-{n}"
    return candidate


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# Keys of the previous stop that a reopened run drops from meta.json (its ``resumed`` record keeps them).
_STOP_KEYS = ("finished", "stopped_by", "error")
# meta.json's wall times: the run's over all its starts, and each start's (a start killed before it could record
# its end counts from its start to the last write in the folder).
WALL, WALL_BY_START = "wall_s", "wall_s_by_start"
# Keys that differ from one start to the next by nature: not listed as changed when a run is resumed.
_PER_START = ("started", "status", "pid", "host")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class RunWriter:
    """Creates a run folder, or reopens a stopped one (``resume``), and appends rows as they finish.

    meta.json gets ``pid`` and ``host``: the process writing the folder. Reopened, the folder keeps its meta and
    rows (``kept``; a torn last row is cut off the file and ``warnings`` says so), is marked running again, and
    its ``resumed`` list gains {at, previous_status, rows_kept}, with the previous stop's ``stopped_by`` or
    ``error``, the entries of ``meta`` that differ from the folder's (``changed``) and the warnings.

    ``columns``: those every appended row must carry; a sweep's or tune's rows are ``ROW_COLUMNS`` (the
    benchmark row), a trace's its requests' columns.

    The end records the wall time (``WALL``): this start's and the earlier ones' summed, each in ``WALL_BY_START``.
    """

    def __init__(self, run_dir: Path, meta: dict, resume: bool = False, columns: tuple[str, ...] = ROW_COLUMNS):
        self.run_dir = Path(run_dir)
        self.columns = tuple(columns)
        self.kept: list[dict] = []  # the rows a reopened folder already had
        self.warnings: list[str] = []
        self.resumed: dict | None = None  # the record of this reopening; None for a new folder
        self.count = 0  # rows appended by this writer
        self._opened = time.monotonic()
        self._earlier: list[float] = []  # the wall time of each earlier start of a reopened folder
        process = {"pid": os.getpid(), "host": platform.node()}
        if resume:
            self.meta = self._reopen(meta, process)
        else:
            self.run_dir.mkdir(parents=True, exist_ok=False)
            self.meta = {"schema_version": SCHEMA_VERSION, "status": "running", **meta, **process}
        write_text_atomic(self.run_dir / META_FILE, _running(self.meta))
        self._rows = AppendLines(self.run_dir / ROWS_FILE)

    def _reopen(self, meta: dict, process: dict) -> dict:
        old = read_meta(self.run_dir / META_FILE)
        rows_path = self.run_dir / ROWS_FILE
        self._earlier = _earlier_walls(old, rows_path)  # before a cut changes the rows' time of last write
        torn = _cut_torn_row(rows_path)
        if torn:
            self.warnings.append(torn)
        if rows_path.is_file():
            check = check_row if self.columns == ROW_COLUMNS else None
            try:
                self.kept, _ = read_rows(rows_path, check)  # no torn row is left to warn about
            except BadRowsLine as e:
                raise UserError(f"{e}; cannot resume: remove line {e.line} of {rows_path} to keep the other rows, "
                                "or start a new run folder with --fresh") from None
        record = {"at": _now(), "previous_status": run_status(old), "rows_kept": len(self.kept)}
        record.update({k: old[k] for k in ("stopped_by", "error") if k in old})
        if old.get("host") != process["host"]:
            record["previous_host"] = old.get("host")
        changed = {k: v for k, v in meta.items() if k not in _PER_START and old.get(k) != v}
        if changed:
            record["changed"] = changed
        if self.warnings:
            record["warnings"] = list(self.warnings)
        self.resumed = record
        kept_meta = {k: v for k, v in old.items() if k not in _STOP_KEYS}
        walls = {WALL: round(sum(self._earlier), 1), WALL_BY_START: self._earlier}  # kept should this start be killed
        return {**kept_meta, "status": "running", **process, "resumed": [*old.get("resumed", []), record], **walls}

    def append(self, row: dict) -> None:
        missing = [c for c in self.columns if c not in row]
        if missing:
            raise ValueError(f"row lacks columns {missing}")
        self._rows.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
        self._rows.flush()
        self.count += 1

    def note(self, **entries) -> None:
        """Record ``entries`` in meta.json now, while the run goes on: they are there even if it is killed."""
        self.meta.update(entries)
        write_text_atomic(self.run_dir / META_FILE, _running(self.meta))

    def finish(self, status: str = "complete", wall_s: float | None = None, **extra) -> None:
        """Record the end: ``status``, the time, the wall times (``wall_s``: this start's, where the caller
        measures it; else since the writer opened the folder) and ``extra``. Where a full disk refuses meta.json's
        temporary file, the end is written over meta.json in place (``_end_in_place``), into the room a running
        run's meta.json keeps (``RESERVE``)."""
        self._rows.close()
        this = round(time.monotonic() - self._opened if wall_s is None else wall_s, 1)
        starts = [*self._earlier, this]
        before = dict(self.meta)
        self.meta.update(status=status, finished=_now(), **{WALL: round(sum(starts), 1), WALL_BY_START: starts},
                         **extra)
        path = self.run_dir / META_FILE
        try:
            write_json_atomic(path, self.meta)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT) or not _end_in_place(path, before, self.meta):
                raise

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, stopped, tb) -> bool:
        """``with writer:`` ends the run as what left the block says (``end``), and lets an exception through."""
        self.end(stopped)
        return False

    def end(self, stopped: BaseException | None = None, **extra) -> None:
        """Finish (``finish``) with the status that what stopped the run gives: nothing, "complete"; Ctrl-C or
        SIGTERM (a KeyboardInterrupt), "interrupted" with ``stopped_by`` (the signal's name); any other
        exception, "failed" with ``error`` (one line), where meta.json can still be written after an OSError."""
        if stopped is None:
            self.finish("complete", **extra)
        elif isinstance(stopped, KeyboardInterrupt):
            self.finish("interrupted", stopped_by=getattr(stopped, "signal_name", "SIGINT"), **extra)
        else:
            try:
                self.finish("failed", error=one_line(stopped), **extra)
            except OSError:
                if not isinstance(stopped, OSError):
                    raise
                # meta.json cannot take the failure either (a full disk): the first error is the one to tell


def _earlier_walls(old: dict, rows_path: Path) -> list[float]:
    """The wall time of each start of a folder being reopened (``old``: its meta.json). A start that recorded no
    end (killed) counts from its start to the last write of its rows, or 0 where that cannot be told."""
    walls = [w for w in old.get(WALL_BY_START, []) if isinstance(w, (int, float)) and not isinstance(w, bool)]
    if not walls and isinstance(old.get(WALL), (int, float)):
        walls = [old[WALL]]  # a folder written before each start's time was kept: its one total
    starts = 1 + len(old.get("resumed", []))
    if len(walls) >= starts:
        return walls[:starts]
    began = old["resumed"][-1].get("at") if old.get("resumed") else old.get("started")
    try:
        last = max(p.stat().st_mtime for p in (rows_path, rows_path.parent / META_FILE) if p.exists())
        lost = max(0.0, round(last - calendar.timegm(time.strptime(str(began), "%Y-%m-%dT%H:%M:%SZ")), 1))
    except (ValueError, OSError):
        lost = 0.0
    return [*walls, *[0.0] * (starts - 1 - len(walls)), lost]


# Trailing spaces a running run's meta.json carries (JSON allows them): room for its end on a full disk.
RESERVE = 1024


def _running(meta: dict) -> str:
    return json.dumps(meta, indent=2) + " " * RESERVE + "\n"


def _end_in_place(path: Path, before: dict, meta: dict) -> bool:
    """Write a run's end (``meta``) over its meta.json (``before``: what it held) in place, where a full disk
    leaves no room for a new file: compact JSON, no longer than the file. Where the whole end does not fit, only
    its status, time and reason are added (they fit the ``RESERVE``: a reason is one line of at most 300
    characters). False where even that does not fit (a meta.json written by another writer)."""
    size = path.stat().st_size
    essential = {**before, **{k: meta[k] for k in ("status", "finished", *_STOP_KEYS) if k in meta}}
    for text in (_compact(meta), _compact(essential)):
        if len(text.encode("utf-8")) <= size:
            return overwrite_in_place(path, text)
    return False


def _compact(meta: dict) -> str:
    return json.dumps(meta, separators=(",", ":")) + "\n"


# ---- a torn last row -----------------------------------------------------------------------------------

def _cut_torn_row(rows_path: Path) -> str | None:
    """Cut a torn last row (no newline after it, not a JSON object) off ``rows_path``; the warning, if any.

    A last row whole but for its newline gets the newline. Bytes, not text: a cut may split a character.
    """
    if not rows_path.exists():
        return None
    data = read_bytes(rows_path, gz=False)
    if not data or data.endswith(b"\n"):
        return None
    start = data.rfind(b"\n") + 1
    try:
        whole = isinstance(parse_json(data[start:], rows_path), dict)
    except UserError:  # not JSON, not UTF-8, or past a bound
        whole = False
    with open(rows_path, "r+b") as f:
        if whole:
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
            return None
        f.truncate(start)
    line = data.count(b"\n") + 1
    return f"warning: {rows_path}: line {line} is cut short (the run stopped while writing it); removed to resume"


# ---- reading -------------------------------------------------------------------------------------------

def read_meta(meta_path: Path) -> dict:
    """A run folder's meta.json as a dict; UserError where it is not a JSON object or a key readers use has the
    wrong type (``rows.check_meta``)."""
    meta = read_json(meta_path, gz=False)
    if not isinstance(meta, dict):
        raise UserError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
    if why := check_meta(meta):
        raise UserError(f"{meta_path}: {why}")
    return meta


def load_run(path: Path | str) -> tuple[dict, pd.DataFrame]:
    """(meta, rows) of a run folder. Raises UserError for a folder that is not a run.

    A last line of rows.jsonl cut short (a run killed while appending) is left out, and
    ``df.attrs["warnings"]`` says so; any other line that is not JSON, or (but in a trace's folder, whose rows
    are requests) not a ``Row`` (``rows.check_row``), is an error naming the file, the line and the field.
    """
    path = Path(path)
    meta_path, rows_path = path / META_FILE, rows_file(path)
    if not path.is_dir():
        raise UserError(f"no run folder at {path}")
    if not meta_path.is_file() or not rows_path.is_file():
        inner = sorted(p.parent.name for p in path.glob(f"*/{META_FILE}"))
        hint = f"; run folders inside it: {', '.join(inner[:3])}{', ...' if len(inner) > 3 else ''}" if inner else ""
        raise UserError(f"{path} is not a moebench run folder (needs {META_FILE} and {ROWS_FILE}){hint}")
    meta = read_meta(meta_path)
    rows, warnings = read_rows(rows_path, None if meta.get("kind") == "trace" else check_row)
    df = pd.DataFrame(rows, columns=list(ROW_COLUMNS) if not rows else None)
    for col in ROW_COLUMNS:
        if col not in df.columns:
            df[col] = None
    df.attrs["warnings"] = warnings
    return meta, df


def rows_file(run_dir: Path) -> Path:
    """The rows of a run folder: rows.jsonl, or rows.jsonl.gz where a committed run keeps them compressed."""
    plain = run_dir / ROWS_FILE
    packed = run_dir / (ROWS_FILE + ".gz")
    return packed if not plain.exists() and packed.is_file() else plain


class BadRowsLine(UserError):
    """A line of a rows file that is no row: not JSON, not an object, or failing the row check. ``path`` and
    ``line`` (from 1) say where, so a command that cannot go on past it can say what to remove."""

    def __init__(self, path: Path, line: int, why: str):
        super().__init__(f"{path}: line {line} {why}")
        self.path, self.line = path, line


def read_rows(rows_path: Path, check=None) -> tuple[list[dict], list[str]]:
    """The rows of a rows.jsonl (or its gzip), and warnings: a torn last line (no newline after it) is skipped.

    ``check`` (a record -> the reason it is no row, or None; ``rows.check_row``) runs on every row; a line
    that is not a JSON object or fails it is a ``BadRowsLine``.
    """
    lines = read_text(rows_path).split("\n")
    rows, warnings = [], []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = parse_json(line, rows_path)
        except NotJSON as e:
            if n == len(lines):  # no newline after it: the row being written when the run stopped
                warnings.append(f"warning: {rows_path}: line {n} is cut short (the run stopped while writing it); "
                                "left out")
                continue
            raise BadRowsLine(rows_path, n, f"is {e.why.split(' at line ')[0]})") from None
        except Refused as e:
            raise BadRowsLine(rows_path, n, f"is past a bound: {e.why}") from None
        if not isinstance(row, dict):
            raise BadRowsLine(rows_path, n, "is not a JSON object")
        if check is not None and (why := check(row)):
            raise BadRowsLine(rows_path, n, f"is no row: {why}")
        rows.append(row)
    return rows, warnings


def schema_warning(meta: dict, where: str) -> str | None:
    v = meta.get("schema_version")
    if v != SCHEMA_VERSION:
        return f"warning: {where} has schema version {v}, this moebench reads {SCHEMA_VERSION}; columns may differ"
    return None


def status_warning(meta: dict, where: str, rows: int) -> str | None:
    """The line to show with the rows of a run that did not run through (killed, interrupted, failed, still
    running); None for a complete run, or a folder whose meta names no status."""
    status = run_status(meta)
    if status in ("complete", None):
        return None
    why = {"interrupted": f" by {meta.get('stopped_by')}" if meta.get("stopped_by") else "",
           "failed": f" ({meta.get('error')})" if meta.get("error") else ""}.get(status, "")
    return f"run {where}: {status}{why} (rows {'so far' if status == 'running' else 'kept'}: {rows})"


def run_ref(run_dir: Path | str, folder: Path | str) -> str:
    """``run_dir`` as a file kept in ``folder`` names it (an export's ``source_run``, the page's runs): the path
    from ``folder`` where the two share a folder below the root, else the run folder's name; never absolute,
    so a committed file carries no machine's paths."""
    run, base = Path(run_dir).resolve(), Path(folder).resolve()
    if os.path.commonpath([run, base]) == run.anchor:
        return run.name
    return Path(os.path.relpath(run, base)).as_posix()


# ---- a run's status ------------------------------------------------------------------------------------

def pid_alive(pid) -> bool:
    """Whether a process ``pid`` exists on this machine (someone else's counts)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def run_status(meta: dict) -> str | None:
    """A run's status as readers should say it: meta's ``status``, but "killed" for a run still marked
    "running" whose process is gone from this host (SIGKILL or a crash: nothing could record the end). A
    "running" run of another host stays "running": its process cannot be looked for from here."""
    status = meta.get("status")
    if status == "running" and meta.get("host") == platform.node() and not pid_alive(meta.get("pid")):
        return "killed"
    return status
