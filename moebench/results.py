"""Run folders: versioned result rows as JSON Lines, and the run's metadata.

A run folder holds ``meta.json`` (schema version, machine, versions, command
line, ceilings, timing method, status) and ``rows.jsonl`` (one JSON object per
benchmark point, appended as each point finishes, so a killed run keeps what
it measured). ``load_run`` reads a folder back into a pandas DataFrame.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path

import pandas as pd

from moebench.errors import UserError

SCHEMA_VERSION = 1
META_FILE = "meta.json"
ROWS_FILE = "rows.jsonl"

# Columns every row carries, in this order (csv/json output and readers rely on them).
ROW_COLUMNS = (
    "model", "experts", "hidden", "intermediate", "topk", "moe_layers", "M", "dtype", "path", "routing",
    "seed", "config", "status", "correct", "rel_err", "time_us", "time_p20_us", "time_p80_us", "reps",
    "floor_us", "bound", "pct_of_floor", "tflops", "gbps", "flops", "bytes", "experts_touched",
    "device_name", "interpreter", "timing_method", "error",
)


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temp file in the same folder (created if missing), then rename: no reader sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


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
    """(meta, rows) of a run folder. Raises UserError for a folder that is not a run."""
    path = Path(path)
    meta_path, rows_path = path / META_FILE, path / ROWS_FILE
    if not path.is_dir():
        raise UserError(f"no run folder at {path}")
    if not meta_path.is_file() or not rows_path.is_file():
        raise UserError(f"{path} is not a moebench run folder (needs {META_FILE} and {ROWS_FILE})")
    try:
        meta = json.loads(meta_path.read_text())
        rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: unreadable JSON ({e.msg}, line {e.lineno})") from None
    df = pd.DataFrame(rows, columns=list(ROW_COLUMNS) if not rows else None)
    for col in ROW_COLUMNS:
        if col not in df.columns:
            df[col] = None
    return meta, df


def schema_warning(meta: dict, where: str) -> str | None:
    v = meta.get("schema_version")
    if v != SCHEMA_VERSION:
        return f"warning: {where} has schema version {v}, this moebench reads {SCHEMA_VERSION}; columns may differ"
    return None
