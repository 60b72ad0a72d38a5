"""Run folders: versioned result rows as JSON Lines, and the run's metadata.

A run folder holds ``meta.json`` (schema version, machine, versions, command
line, ceilings, timing method, status) and ``rows.jsonl`` (one JSON object per
benchmark point, appended as each point finishes, so a killed run keeps what
it measured). ``load_run`` reads a folder back into a pandas DataFrame.
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
import time
from pathlib import Path

import pandas as pd

from moebench.errors import UserError
from moebench.rows import Row

SCHEMA_VERSION = 1
META_FILE = "meta.json"
ROWS_FILE = "rows.jsonl"

# Columns every row carries, in this order (csv/json output and readers rely on them): the fields of Row.
ROW_COLUMNS = Row.columns()


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temp file in the same folder (created if missing), then rename: no reader sees half a file.

    The temp file is created with the permissions of any new file (0666 less the umask), not the 0600 of
    ``tempfile``, so the renamed file reads like one written in place.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


def ensure_out_dir(base: Path) -> Path:
    """Create ``base``, the folder run folders go in, and check it takes new files; OSError where it cannot.

    Called before a run starts, so an ``--out`` that is a file or read-only fails before any work.
    """
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    if not os.access(base, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "cannot create files in this folder", str(base))
    return base


def new_run_dir(base: Path, name: str) -> Path:
    """A fresh folder name under ``base`` (not created): ``<UTC time>-<name>``."""
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


class RunWriter:
    """Creates a run folder and appends rows as they finish."""

    def __init__(self, run_dir: Path, meta: dict):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=False)
        self.meta = {"schema_version": SCHEMA_VERSION, "status": "running", **meta}
        write_json_atomic(self.run_dir / META_FILE, self.meta)
        self._rows = open(self.run_dir / ROWS_FILE, "a", encoding="utf-8")
        self.count = 0

    def append(self, row: dict) -> None:
        missing = [c for c in ROW_COLUMNS if c not in row]
        if missing:
            raise ValueError(f"row lacks columns {missing}")
        self._rows.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
        self._rows.flush()
        self.count += 1

    def finish(self, status: str = "complete", **extra) -> None:
        self._rows.close()
        self.meta.update(status=status, finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra)
        write_json_atomic(self.run_dir / META_FILE, self.meta)


def load_run(path: Path | str) -> tuple[dict, pd.DataFrame]:
    """(meta, rows) of a run folder. Raises UserError for a folder that is not a run.

    A last line of rows.jsonl cut short (a run killed while appending) is left out, and
    ``df.attrs["warnings"]`` says so; any other line that is not JSON is an error naming it.
    """
    path = Path(path)
    meta_path, rows_path = path / META_FILE, path / ROWS_FILE
    if not path.is_dir():
        raise UserError(f"no run folder at {path}")
    if not meta_path.is_file() or not rows_path.is_file():
        inner = sorted(p.parent.name for p in path.glob(f"*/{META_FILE}"))
        hint = f"; run folders inside it: {', '.join(inner[:3])}{', ...' if len(inner) > 3 else ''}" if inner else ""
        raise UserError(f"{path} is not a moebench run folder (needs {META_FILE} and {ROWS_FILE}){hint}")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{meta_path}: not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise UserError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
    rows, warnings = _read_rows(rows_path)
    df = pd.DataFrame(rows, columns=list(ROW_COLUMNS) if not rows else None)
    for col in ROW_COLUMNS:
        if col not in df.columns:
            df[col] = None
    df.attrs["warnings"] = warnings
    return meta, df


def _read_rows(rows_path: Path) -> tuple[list[dict], list[str]]:
    """The rows of a rows.jsonl, and warnings: a torn last line (no newline after it) is skipped."""
    try:
        text = rows_path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{rows_path}: not UTF-8 text") from None
    lines = text.split("\n")
    rows, warnings = [], []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):  # no newline after it: the row being written when the run stopped
                warnings.append(f"warning: {rows_path}: line {n} is cut short (the run stopped while writing it); "
                                "left out")
                continue
            raise UserError(f"{rows_path}: line {n} is not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise UserError(f"{rows_path}: line {n} is not a JSON object")
        rows.append(row)
    return rows, warnings


def schema_warning(meta: dict, where: str) -> str | None:
    v = meta.get("schema_version")
    if v != SCHEMA_VERSION:
        return f"warning: {where} has schema version {v}, this moebench reads {SCHEMA_VERSION}; columns may differ"
    return None
