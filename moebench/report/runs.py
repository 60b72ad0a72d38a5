"""The data every report reads: run folders loaded once into one table of rows and their runs' metadata.

Tables (``report.tables``), comparisons (``report.compare``), charts (``report.charts``) and the
HTML page (``report.page``) all take a ``Runs``, so what they show comes from the same rows and
cannot disagree. A path named on the command line is a run folder, or a folder of run folders (a
baseline made of several runs of the same sweep, ``results/baselines/...``).

A run is of one kind (``Run.kind``): a sweep's or tune's rows are benchmark points (``Runs.rows``), a trace's
are requests (``Runs.traces``), a step's are the parts of a model's step (``Runs.steps``, read by
``report.steps``). Step runs are read only with step runs and traces: their rows share no point with a sweep's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from moebench.errors import UserError
from moebench.store.best import best_path
from moebench.store.runfolder import (
    META_FILE,
    ROW_COLUMNS,
    ROWS_FILE,
    load_run,
    read_meta,
    read_rows,
    rows_file,
    schema_warning,
    status_warning,
)
from moebench.store.step_rows import PARTS, STEP_COLUMNS

KINDS = ("sweep", "trace", "step")  # a tune's folder is of kind "sweep": its rows are benchmark rows
# The fields a step row must carry for its step to be composed (``report.compose``).
_STEP_NEEDS = ("model", "dtype", "phase", "batch", "length", "part", "path", "count", "measured", "status",
               "time_us")


@dataclass(frozen=True)
class Run:
    """One run folder: where it is, its ``meta.json`` and its rows (a ``run`` column names the folder)."""

    path: Path
    meta: dict
    rows: pd.DataFrame

    @property
    def label(self) -> str:
        return self.path.name

    @property
    def kind(self) -> str:
        """"trace" for a ``moebench trace`` folder (a row per request), "step" for a ``moebench step`` folder (a
        row per part of the model's step at a point), else "sweep" (sweeps and tunes)."""
        return _kind(self.meta)

    @property
    def interpreter(self) -> bool:
        return bool(self.meta.get("interpreter"))

    @property
    def empty(self) -> bool:
        """No rows, and no tune's choice (``best.json``) either: nothing a report can show."""
        return self.rows.empty and not (self.meta.get("tune") and best_path(self.path).is_file())

    @property
    def device(self) -> str:
        return str(self.meta.get("device_name") or self.meta.get("gpu_name") or "unknown device")


@dataclass(frozen=True)
class Runs:
    """Several runs taken together: ``rows`` is their rows, one table, with ``run`` and ``commit`` columns."""

    runs: tuple[Run, ...]
    warnings: tuple[str, ...] = field(default=())

    @property
    def traces(self) -> list[Run]:
        """The trace runs (``moebench trace``): their rows are requests, kept apart from the benchmark rows."""
        return [r for r in self.runs if r.kind == "trace"]

    @property
    def steps(self) -> list[Run]:
        """The step runs (``moebench step``): their rows are a model's parts, read by ``report.steps``."""
        return [r for r in self.runs if r.kind == "step"]

    @property
    def rows(self) -> pd.DataFrame:
        """The benchmark rows of every sweep and tune run (trace runs' requests are in ``traces``, step runs'
        parts in ``steps``)."""
        frames = [r.rows for r in self.runs if r.kind == "sweep"]
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*ROW_COLUMNS, "run", "commit"])
        df.attrs["warnings"] = list(self.warnings)
        return df

    @property
    def devices(self) -> list[str]:
        """The devices the runs ran on, each once, in order."""
        return list(dict.fromkeys(r.device for r in self.runs))

    @property
    def interpreter(self) -> bool:
        """True when every run ran on the CPU interpreter."""
        return bool(self.runs) and all(r.interpreter for r in self.runs)

    def machine_line(self) -> str:
        """Where the runs ran and the ceilings each measured, in one line for a caption."""
        parts = []
        for device in self.devices:
            metas = [r.meta for r in self.runs if r.device == device]
            m = metas[0]
            if m.get("interpreter"):
                parts.append("CPU, Triton interpreter: timings are not GPU performance")
                continue
            soft = ", ".join(f"{k} {m[k]}" for k in ("torch", "triton") if m.get(k))
            text = f"{device} ({soft})" if soft else device
            ceil = ceilings_text([meta.get("ceilings") for meta in metas])
            parts.append(f"{text}; ceilings {ceil}" if ceil else text)
        return " | ".join(parts) or "no runs"


def ceilings_text(ceilings: dict | list[dict | None] | None) -> str:
    """One run's measured ceilings (its meta's ``ceilings``), or several runs' with a range where they differ,
    as people read them: 'read 4.53-4.63 TB/s, bf16 794 TFLOP/s, fp8 1436 TFLOP/s'."""
    found = [c for c in (ceilings if isinstance(ceilings, list) else [ceilings]) if c]

    def span(key: str, scale: float, digits: int, unit: str) -> str | None:
        values = sorted(c[key] / scale for c in found if c.get(key))
        if not values:
            return None
        lo, hi = f"{values[0]:.{digits}f}", f"{values[-1]:.{digits}f}"
        return f"{lo} {unit}" if lo == hi else f"{lo}-{hi} {unit}"

    parts = [("read", span("read_gbps", 1000, 2, "TB/s")), ("bf16", span("bf16_tflops", 1, 0, "TFLOP/s")),
             ("fp8", span("fp8_tflops", 1, 0, "TFLOP/s"))]
    return ", ".join(f"{name} {text}" for name, text in parts if text)


def run_folders(path: Path) -> list[Path]:
    """``path`` itself where it is a run folder, else the run folders directly inside it (a baseline).

    UserError where it is neither: no such folder, JSON Lines with no ``meta.json`` (a probe's or an A/B's
    records, which are no run), a folder of folders of runs (named, to be given one by one), or nothing.
    """
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"no run folder at {path}")
    if (path / META_FILE).is_file():
        return [path]
    inner = sorted(p.parent for p in path.glob(f"*/{META_FILE}") if rows_file(p.parent).is_file())
    if inner:
        return inner
    needs = f"needs {META_FILE} and {ROWS_FILE}"
    if lines := sorted(p.name for p in path.glob("*.jsonl*")):
        raise UserError(f"{path} holds JSON Lines ({', '.join(lines[:2])}{', ...' if len(lines) > 2 else ''}) but "
                        f"no {META_FILE}: records of a probe or an A/B, not a moebench run folder ({needs})")
    nested = sorted({p.parent.parent.relative_to(path).as_posix() for p in path.glob(f"*/*/{META_FILE}")})
    if nested:
        raise UserError(f"{path} holds folders of run folders, not runs: name them one by one "
                        f"({', '.join(str(path / n) for n in nested[:3])})")
    raise UserError(f"{path} is not a moebench run folder ({needs}) nor a folder of run folders")


def _kind(meta: dict) -> str:
    return meta.get("kind") if meta.get("kind") in KINDS else "sweep"


def check_step_row(record: dict) -> str | None:
    """Why a record of a step run's rows.jsonl is no step row (a field ``report.compose`` reads is missing, or an
    unknown part), or None."""
    if missing := [c for c in _STEP_NEEDS if c not in record]:
        return f"field '{missing[0]}' is missing (not a moebench step row)"
    if record["part"] not in PARTS:
        return f"part {record['part']!r} is none of {', '.join(PARTS)} (not a moebench step row)"
    return None


def _read(path: Path) -> tuple[dict, pd.DataFrame]:
    """(meta, rows) of a run folder: a sweep's or tune's through ``load_run`` (its rows checked as benchmark
    rows); a trace's requests as they are; a step's parts checked as step rows, every column of STEP_COLUMNS
    present and None kept None (``report.compose`` reads the records back)."""
    meta_path = path / META_FILE
    meta = read_meta(meta_path) if meta_path.is_file() and rows_file(path).is_file() else {}
    if (kind := _kind(meta)) == "sweep":
        return load_run(path)  # the folder's errors (no rows file, ...) are load_run's
    records, torn = read_rows(rows_file(path), check_step_row if kind == "step" else None)
    if kind == "trace":  # a row per request, not the benchmark's columns
        df = pd.DataFrame(records)
    else:
        columns = list(dict.fromkeys([*STEP_COLUMNS, *(k for r in records for k in r)]))
        df = pd.DataFrame([[r.get(c) for c in columns] for r in records], columns=columns, dtype=object)
    df.attrs["warnings"] = torn
    return meta, df


def load_one(path: Path) -> tuple[Run, list[str]]:
    """A run folder as a ``Run`` and the warnings to show with it (schema, status, a torn last row)."""
    meta, df = _read(Path(path))
    warnings = [w for w in (schema_warning(meta, str(path)), status_warning(meta, str(path), len(df))) if w]
    warnings += df.attrs.get("warnings", [])
    df = df.assign(run=Path(path).name, commit=meta.get("git_commit"))
    df.attrs = {}
    return Run(Path(path), meta, df), warnings


def load(paths: list[Path] | tuple[Path, ...]) -> Runs:
    """Every run under ``paths`` (run folders, or folders of run folders), in the order given.

    A run with no rows (an empty rows.jsonl; a tune's choice in best.json counts as a row) gets a warning;
    runs that together hold none are a UserError: every command that reads runs needs rows to read. So is a run
    named twice (itself and the folder it is in, say): its rows would count twice. So are step runs named with
    sweeps or tunes: a step's parts and a sweep's points are no one table (a trace's requests give a step its
    cold start: ``report.steps.cold_start_table``).
    """
    runs, warnings, seen = [], [], {}  # seen: each run folder, resolved -> as named
    for p in paths:
        for folder in run_folders(Path(p)):
            if (same := seen.setdefault(folder.resolve(), folder)) is not folder:
                twice = "named twice" if same == folder else f"named twice ({same} and {folder})"
                raise UserError(f"run {folder} is {twice}: its rows would count twice")
            run, w = load_one(folder)
            runs.append(run)
            warnings += w
            if run.empty:
                warnings.append(f"warning: run {folder}: no rows ({rows_file(folder).name} is empty)")
    steps, others = [r for r in runs if r.kind == "step"], [r for r in runs if r.kind == "sweep"]
    if steps and others:
        raise UserError(f"{steps[0].path} is a step run (moebench step) and {others[0].path} a {others[0].kind} run: "
                        "step runs are read only with step runs and traces; name them in separate commands")
    if all(run.empty for run in runs):
        names = ", ".join(str(p) for p in paths)
        raise UserError(f"{names}: no rows: the run recorded no point ({ROWS_FILE} is empty), nothing to read")
    return Runs(tuple(runs), tuple(warnings))
