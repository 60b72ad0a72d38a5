"""``export-configs``: a run's best tile config per M, written where an engine (or moebench) reads it, with provenance.

Layouts: "vllm" and "sglang" take the rows of path ``triton-classic`` (the engines' kernel form, the only
timings that say which of their configs is fastest) and write the engines' files (``moebench.tables.engine``);
"moebench" takes the rows of path ``triton`` (moebench's kernel) and writes ``moebench.tables.own`` files with
every tile field. A tune's "final" re-timings pick the config where an M has them.

What the engines' files cannot hold (device, Triton and torch versions, date, kernel form, commit, source
run, the M keys) goes in a sidecar, ``moebench-export.json`` in the output folder, one entry per written
file keyed by its path under that folder, merged into the sidecar already there. Every file is placed
and checked before the first is written; each is written to a temporary file and renamed.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from moebench.errors import UserError
from moebench.store.atomic import write_json_atomic, write_text_atomic
from moebench.tables import engine as configs
from moebench.tables import own as tables

LAYOUTS = ("vllm", "sglang", "moebench")
ENV_VARS = {"vllm": "VLLM_TUNED_CONFIG_FOLDER", "sglang": "SGLANG_MOE_CONFIG_DIR"}  # where each engine looks
SIDECAR = "moebench-export.json"
SIDECAR_FORMAT = "moebench-export"
SIDECAR_VERSION = 1


@dataclass(frozen=True)
class Export:
    """What an export wrote: the files (sidecar last), the shell line that points the engine at them
    (None for moebench's own tables), and warnings (an M tuned but with no timed config)."""

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


def _one_or_list(values: pd.Series) -> int | list[int]:
    distinct = sorted({int(v) for v in values.dropna()})
    return distinct[0] if len(distinct) == 1 else distinct


def _shape(rows: pd.DataFrame, key: tuple) -> dict:
    experts, n = key[0], key[1]
    return {"experts": experts, "intermediate": n, "hidden": _one_or_list(rows["hidden"]),
            "topk": _one_or_list(rows["topk"])}


def _entry(layout: str, path: str, key: tuple, at: pd.DataFrame, table: configs.ConfigTable, common: dict,
           engine_triton: str | None) -> dict:
    """The sidecar's entry for one written file: what was tuned, on what, from which rows."""
    final = at["phase"].eq("final") if "phase" in at.columns else pd.Series(False, index=at.index)
    return {
        "layout": layout, "kernel": path, "device_name": key[3], "dtype": key[2], "shape": _shape(at, key),
        "models": sorted({str(m) for m in at["model"].dropna()}), **common,
        "engine_triton": engine_triton if layout == "sglang" else None,
        "M": list(table), "final_M": sorted({int(m) for m in at.loc[final, "M"]}),
    }


def _untimed(df: pd.DataFrame, path: str, found: Mapping[tuple, configs.ConfigTable]) -> list[str]:
    """A warning for each (table, M) with rows of ``path`` but no timed config: the engine uses the nearest M."""
    rows = df[df["path"] == path]
    out = []
    for key, group in rows.groupby(list(configs.TABLE_KEY), sort=True):
        have = found.get(configs.table_key(key), {})
        missing = sorted(int(m) for m in set(group["M"]) if int(m) not in have)
        if missing:
            out.append(f"warning: E={key[0]} N={key[1]} {key[2]} on {key[3]}: no correct, timed {path} row at M="
                       f"{','.join(map(str, missing))}; {'the nearest M is used there' if have else 'no table'}")
    return out


def _read_sidecar(path: Path) -> dict:
    """The sidecar already in the output folder, or a fresh one; one this moebench cannot merge is a UserError."""
    if not path.exists():
        return {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "files": {}}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raw = None
    if (not isinstance(raw, dict) or raw.get("format") != SIDECAR_FORMAT
            or raw.get("version") != SIDECAR_VERSION or not isinstance(raw.get("files"), dict)):
        raise UserError(f"{path}: not a {SIDECAR_FORMAT} version {SIDECAR_VERSION} file this moebench can update; "
                        "move it away or export to another --out")
    return raw


def export_run(meta: Mapping, df: pd.DataFrame, out_dir: Path, layout: str = "vllm",
               engine_triton: str | None = None, source_run: str | None = None) -> Export:
    """Write the best config per (E, N, dtype, device) and M of a run (``meta``, ``df`` as ``load_run``
    returns them) in ``layout`` under ``out_dir``, and the sidecar. ``engine_triton`` (sglang only): the
    Triton the SGLang server runs, which names its folder (default ``configs.SGLANG_TRITON``).
    ``source_run``: the run folder, for provenance. Bad input is a UserError before anything is written."""
    if layout not in LAYOUTS:
        raise UserError(f"unknown layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")
    if engine_triton is not None and layout != "sglang":
        raise UserError("--engine-triton names SGLang's folder: it goes with --layout sglang")
    if layout == "sglang":
        engine_triton = engine_triton or configs.SGLANG_TRITON
        configs.sglang_triton_dir(engine_triton)  # a bad version string fails here
    out_dir = Path(out_dir)
    _check_out(out_dir)
    run = source_run or "the run"
    flags = df["interpreter"] if "interpreter" in df.columns else pd.Series(dtype=object)
    if meta.get("interpreter") is True or flags.map(lambda v: configs.flag(v) is True).any():
        raise UserError(f"{run} is an interpreter (CPU) run: its timings cannot choose GPU tile configs")
    path = tables.KERNEL if layout == "moebench" else configs.ENGINE_PATH
    rows = configs.timed_rows(df, path)
    best = configs.best_of(rows)
    if not best:
        how = ("tune with `moebench tune --path triton-classic`; moebench's own kernel's tables: --layout moebench"
               if path == configs.ENGINE_PATH else "tune with `moebench tune --path triton`")
        raise UserError(f"{run} has no correct, timed {path} rows for --layout {layout}: {how}")
    per_table = {key: rows[rows["_table"].map(key.__eq__).astype(bool)] for key in best}
    common = {"triton_version": meta.get("triton"), "torch_version": meta.get("torch"),
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": meta.get("git_commit"),
              "source_run": source_run}
    if layout == "moebench":
        files = {}
        for key, table in best.items():
            experts, n, dtype, device = key
            head = tables.TableMeta(device_name=device, dtype=dtype, shape=_shape(per_table[key], key), **common)
            files[out_dir / tables.table_file_name(experts, n, device, dtype)] = (key, tables.table_text(head, table))
    else:
        files = configs.engine_files(best, out_dir, layout, tuned_triton=meta.get("triton"),
                                     engine_triton=engine_triton or configs.SGLANG_TRITON)
    sidecar_path = out_dir / SIDECAR
    sidecar = _read_sidecar(sidecar_path)
    for file, (key, _) in files.items():
        sidecar["files"][file.relative_to(out_dir).as_posix()] = _entry(
            layout, path, key, per_table[key], best[key], common, engine_triton)
    sidecar["files"] = dict(sorted(sidecar["files"].items()))
    for file, (_, text) in files.items():
        write_text_atomic(file, text)
    write_json_atomic(sidecar_path, sidecar)
    env = ENV_VARS.get(layout)
    env_line = f"export {env}={shlex.quote(str(out_dir.resolve()))}" if env else None
    return Export(files=(*files, sidecar_path), env_line=env_line, warnings=tuple(_untimed(df, path, best)))
