"""``export-configs``: a run's best tile config per M, written where an engine (or moebench) reads it, with provenance.

rows -> pick.timed_rows(format's PATH) -> pick.best_of -> format's folder, file_name (``plan_export``)
     -> format's file_text -> files + sidecar (``write_export``)

The layout names a format module (``moebench.tables.formats.FORMATS``): "vllm" and "sglang" take the rows of path
``triton-classic`` (the engines' kernel form, the only timings that say which of their configs is fastest) and
write the engines' files; "moebench" takes the rows of path ``triton`` (moebench's kernel) and writes moebench's
own tables with every tile field. A tune's "final" re-timings pick the config where an M has them.

What the engines' files cannot hold (device, Triton and torch versions, date, kernel form, commit, source
run, the M keys, the time each entry was picked with) goes in a sidecar, ``moebench-export.json`` in the output
folder, one entry per written file keyed by its path under that folder, merged into the sidecar already there.
Every file is placed and checked before the first is written; then all are written as one
(``store.atomic.write_files_atomic``): where one fails, none is left new.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import pandas as pd

from moebench.bounded import read_json
from moebench.errors import UserError
from moebench.store.atomic import write_files_atomic
from moebench.store.runfolder import run_ref
from moebench.tables.formats import FORMATS, get_format
from moebench.tables.pick import PICK_PHASES, TABLE_KEY, best_of, flag, table_key, timed_rows
from moebench.tables.table import ConfigTable, Provenance

SIDECAR = "moebench-export.json"
SIDECAR_FORMAT = "moebench-export"
SIDECAR_VERSION = 1


@dataclass(frozen=True)
class Export:
    """What an export wrote: the files (sidecar last), the shell line that points the engine at them
    (None where the format names no variable: moebench's own tables), and warnings (an M tuned but with no
    timed config)."""

    files: tuple[Path, ...]
    env_line: str | None
    warnings: tuple[str, ...] = ()


def _check_out(out_dir: Path) -> None:
    """``out_dir`` is a folder or can become one: no file where it or a folder above it would be."""
    for p in (out_dir, *out_dir.parents):
        if p.exists():
            if not p.is_dir():
                where = "" if p == out_dir else f": {p}"
                raise UserError(f"--out {out_dir}{where} is a file, not a folder")
            return


def _engine_triton(fmt: ModuleType, engine_triton: str | None) -> str | None:
    """The serving engine's Triton for a format whose folder it names (its default where not given); None for the
    others, where giving one is a UserError."""
    if fmt.ENGINE_TRITON is not None:
        return engine_triton or fmt.ENGINE_TRITON
    if engine_triton is not None:
        takers = {name: f for name, f in FORMATS.items() if f.ENGINE_TRITON is not None}
        raise UserError(f"--engine-triton names {' or '.join(f.READER for f in takers.values())}'s folder: "
                        f"it goes with --layout {' or '.join(takers)}")
    return None


def _one_or_list(values: pd.Series) -> int | list[int]:
    distinct = sorted({int(v) for v in values.dropna()})
    return distinct[0] if len(distinct) == 1 else distinct


def _shape(rows: pd.DataFrame, key: tuple) -> dict:
    experts, n = key[0], key[1]
    return {"experts": experts, "intermediate": n, "hidden": _one_or_list(rows["hidden"]),
            "topk": _one_or_list(rows["topk"])}


def _place(fmt: ModuleType, best: Mapping[tuple, ConfigTable], folder: Path) -> dict[Path, tuple[tuple, ConfigTable]]:
    """Where each table goes, nothing written: {path: (table key, table)}. Two tables that map to one file name
    (e.g. fp8-tensor and fp8-channel in vLLM's naming) are a UserError."""
    files: dict[Path, tuple[tuple, ConfigTable]] = {}
    for key, table in best.items():
        experts, n, dtype, device = key
        path = folder / fmt.file_name(experts, n, device, dtype)
        if path in files:
            raise UserError(
                f"{files[path][0][2]} and {dtype} tables (E={experts}, N={n}, {device}) "
                f"both map to {path.name}; export them one at a time"
            )
        files[path] = (key, table)
    return files


def _entry(layout: str, path: str, key: tuple, at: pd.DataFrame, table: ConfigTable, made: Provenance,
           engine_triton: str | None) -> dict:
    """The sidecar's entry for one written file: what was tuned, on what, from which rows, and the time each
    entry was tuned with."""
    # M picked from a tune's re-timings: its final phase, or the choice re-timed against the default beside it
    final = at["phase"].isin(PICK_PHASES) if "phase" in at.columns else pd.Series(False, index=at.index)
    return {
        "layout": layout, "kernel": path, "device_name": key[3], "dtype": key[2], "shape": _shape(at, key),
        "models": sorted({str(m) for m in at["model"].dropna()}), **asdict(made), "engine_triton": engine_triton,
        "M": list(table), "final_M": sorted({int(m) for m in at.loc[final, "M"]}), "times": tuned_times(at, table),
    }


def tuned_times(at: pd.DataFrame, table: ConfigTable) -> dict[str, dict]:
    """Per M (a string, as in the files), the time the table's config was picked with: its fastest row there
    (``time_us``, ``p20_us``, ``p80_us``). Empty where the rows span several problems (hidden sizes, top-k,
    routings), whose raw times do not compare with one re-timing."""
    if any(c in at.columns and at[c].nunique(dropna=True) > 1 for c in ("hidden", "topk", "routing")):
        return {}
    out = {}
    keys = at["_tile"].map(lambda t: t.key())
    for m, cfg in table.items():
        rows = at[(at["M"] == m) & keys.map(cfg.key().__eq__).astype(bool)]
        if rows.empty:
            continue
        best = rows.loc[rows["time_us"].astype(float).idxmin()]
        out[str(m)] = {k: _num(best.get(c)) for k, c in
                       (("time_us", "time_us"), ("p20_us", "time_p20_us"), ("p80_us", "time_p80_us"))}
    return out


def _num(v) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def _untimed(df: pd.DataFrame, path: str, found: Mapping[tuple, ConfigTable]) -> list[str]:
    """A warning for each (table, M) with rows of ``path`` but no timed config: the engine uses the nearest M."""
    rows = df[df["path"] == path]
    out = []
    for key, group in rows.groupby(list(TABLE_KEY), sort=True):
        have = found.get(table_key(key), {})
        missing = sorted(int(m) for m in set(group["M"]) if int(m) not in have)
        if missing:
            out.append(f"warning: E={key[0]} N={key[1]} {key[2]} on {key[3]}: no correct, timed {path} row at M="
                       f"{','.join(map(str, missing))}; {'the nearest M is used there' if have else 'no table'}")
    return out


def read_sidecar(path: Path) -> dict:
    """The sidecar already in the output folder, or a fresh one; one this moebench cannot merge is a UserError."""
    if not path.exists():
        return {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "files": {}}
    try:
        raw = read_json(path, gz=False)
    except UserError:
        raw = None
    if (not isinstance(raw, dict) or raw.get("format") != SIDECAR_FORMAT
            or raw.get("version") != SIDECAR_VERSION or not isinstance(raw.get("files"), dict)):
        raise UserError(f"{path}: not a {SIDECAR_FORMAT} version {SIDECAR_VERSION} file this moebench can update; "
                        "move it away or export to another --out")
    return raw


@dataclass
class Planned:
    """An export placed and checked, nothing written: each file's table (``tables``: path -> (key, table)), the
    rows each table was picked from (``rows``, by key), and what the files and the sidecar record. A caller may
    change a table (``--merge-with``) before ``write_export``."""

    fmt: ModuleType
    layout: str
    out_dir: Path
    made: Provenance
    engine_triton: str | None
    tables: dict[Path, tuple[tuple, ConfigTable]]
    rows: dict[tuple, pd.DataFrame]
    warnings: tuple[str, ...] = ()


def _engine_warnings(layout: str, tables: Mapping[Path, tuple], rows: Mapping[tuple, pd.DataFrame],
                     run_triton: str | None, engine_triton: str | None, merge_with: Path | None) -> list[str]:
    """Warnings of what the engine will make of the files: a file of the name the engine's release ships, which
    the export shadows at every M (``--merge-with`` keeps its faster entries); a table tuned under another Triton
    than the engine folder it is filed under; a table of SGLang's fused form written for another reader."""
    from moebench.tables.shipped_names import RELEASES, ships

    out = []
    for file, (key, _) in tables.items():
        if ships(layout, file.name) and (merge_with is None or Path(merge_with).name != file.name):
            out.append(f"warning: {RELEASES[layout]} ships {file.name}: read first, this export shadows the shipped "
                       f"table at every M; --merge-with the shipped file keeps its entries where they are faster")
        models = {str(m) for m in rows[key]["model"].dropna()} if "model" in rows[key].columns else set()
        if layout != "sglang" and any(m.endswith("+shared") for m in models):
            out.append(f"warning: {file.name} is of a tune with the shared expert in the routed layer "
                       f"(--shared-fused), as SGLang serves it; {FORMATS[layout].READER} runs E={key[0] - 1}")
    if engine_triton is not None and run_triton and str(run_triton).split("+")[0] != engine_triton:
        out.append(f"warning: the run was timed under Triton {run_triton} and the files go in the folder of Triton "
                   f"{engine_triton}: tune under the server's Triton, or `moebench retime` the files there")
    return out


def plan_export(meta: Mapping, df: pd.DataFrame, out_dir: Path, layout: str = "vllm",
                engine_triton: str | None = None, source_run: str | None = None,
                merge_with: Path | None = None) -> Planned:
    """The best config per (E, N, dtype, device) and M of a run (``meta``, ``df`` as ``load_run`` returns them),
    placed in ``layout`` (a name in ``FORMATS``) under ``out_dir``; nothing written. ``engine_triton`` (sglang
    only): the Triton the SGLang server runs, which names its folder (default the format's ``ENGINE_TRITON``).
    ``source_run``: the run folder, recorded as ``out_dir`` reaches it (``run_ref``). ``merge_with``: the engine's
    file the table is merged with (no warning that the export shadows it). Bad input is a UserError."""
    fmt = get_format(layout)
    engine_triton = _engine_triton(fmt, engine_triton)
    out_dir = Path(out_dir)
    folder = fmt.folder(out_dir, engine_triton)  # a bad engine Triton fails here
    _check_out(out_dir)
    run = source_run or "the run"
    flags = df["interpreter"] if "interpreter" in df.columns else pd.Series(dtype=object)
    if meta.get("interpreter") is True or flags.map(lambda v: flag(v) is True).any():
        raise UserError(f"{run} is an interpreter (CPU) run: its timings cannot choose GPU tile configs")
    rows = timed_rows(df, fmt.PATH)
    best = best_of(rows)
    if not best:
        raise UserError(f"{run} has no correct, timed {fmt.PATH} rows for --layout {layout}: {fmt.HINT}")
    per_table = {key: rows[rows["_table"].map(key.__eq__).astype(bool)] for key in best}
    read_sidecar(out_dir / SIDECAR)  # one this moebench cannot update stops the export here
    made = Provenance(triton_version=meta.get("triton"), torch_version=meta.get("torch"),
                      created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), commit=meta.get("git_commit"),
                      source_run=None if source_run is None else run_ref(source_run, out_dir))
    placed = _place(fmt, best, folder)
    warnings = _untimed(df, fmt.PATH, best) + _engine_warnings(layout, placed, per_table, meta.get("triton"),
                                                               engine_triton, merge_with)
    return Planned(fmt, layout, out_dir, made, engine_triton, placed, per_table, tuple(warnings))


def write_export(plan: Planned, extra: Mapping[Path, dict] | None = None) -> Export:
    """Write ``plan``'s tables and the sidecar as one (``extra``: more fields for a file's sidecar entry)."""
    fmt, out_dir = plan.fmt, plan.out_dir
    sidecar_path = out_dir / SIDECAR
    sidecar = read_sidecar(sidecar_path)
    texts = {}
    for file, (key, table) in plan.tables.items():
        at = plan.rows[key]
        texts[file] = fmt.file_text(key, table, _shape(at, key), plan.made)
        sidecar["files"][file.relative_to(out_dir).as_posix()] = {
            **_entry(plan.layout, fmt.PATH, key, at, table, plan.made, plan.engine_triton),
            **(extra or {}).get(file, {})}
    sidecar["files"] = dict(sorted(sidecar["files"].items()))
    # the tables and their sidecar as one: an engine never finds a table whose export failed
    write_files_atomic({**texts, sidecar_path: json.dumps(sidecar, indent=2) + "\n"})
    env_line = f"export {fmt.ENV_VAR}={shlex.quote(str(out_dir.resolve()))}" if fmt.ENV_VAR else None
    return Export(files=(*plan.tables, sidecar_path), env_line=env_line, warnings=plan.warnings)


def export_run(meta: Mapping, df: pd.DataFrame, out_dir: Path, layout: str = "vllm",
               engine_triton: str | None = None, source_run: str | None = None) -> Export:
    """Write the best config per (E, N, dtype, device) and M of a run in ``layout`` under ``out_dir``, and the
    sidecar (``plan_export``, then ``write_export``). Bad input is a UserError before anything is written."""
    return write_export(plan_export(meta, df, out_dir, layout, engine_triton, source_run))
