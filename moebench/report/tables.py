"""Throughput and TTFT tables from a run's rows, rendered for people (rich) or programs (csv, json).

The table functions return plain DataFrames with stable column names; ``render``
turns any of them (or a ``compare`` table) into a rich table, CSV or JSON, so a
person and a program read the same numbers.

Rows from a CPU-interpreter run are marked: their timings say nothing about GPU
performance, and every rendering for people says so (``interpreter_caption``).
What such a run checks is correctness, so its throughput table carries ``correct``
and ``rel_err``, leaves the throughput figures empty, and shows people only the
check; the TTFT table leaves it out, as it leaves out M below prefill size.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from moebench.errors import UserError

INTERPRETER_CAPTION = "CPU interpreter: timings are not GPU performance"

THROUGHPUT_COLUMNS = [
    "model", "dtype", "M", "path", "time_us", "pct_of_floor", "tflops", "gbps", "decode_tok_s",
]
TTFT_COLUMNS = ["model", "dtype", "path", "prompt_len", "moe_ttft_ms"]
CHECK_COLUMNS = ["correct", "rel_err"]  # appended to the throughput table where rows come from the interpreter
# What people see of an interpreter run: the check against the fp32 reference, no throughput.
INTERPRETER_VIEW = ["model", "dtype", "M", "path", *CHECK_COLUMNS]
_GPU_FIGURES = ["pct_of_floor", "tflops", "gbps", "decode_tok_s"]  # left empty on interpreter rows

_POINT = ["model", "dtype", "M", "path"]
# What the TTFT table's figure is and is not, printed with it wherever it is shown.
TTFT_NOTE = ("moe_ttft_ms = MoE layers x one warm layer time at M = prompt length (align, GEMMs, activation, "
             "top-k sum). Excludes attention, the router, dense layers, communication, and compilation: a cold "
             "start's compile cost is what `moebench trace` measures; the model's TTFT is what `moebench step` "
             "measures.")
_PROMPT_MIN = 128  # default TTFT prompt lengths: the measured M at or above this (prefill-sized)


def interpreter_rows(df: pd.DataFrame) -> pd.Series:
    """Per row of ``df``: True where it came from the CPU interpreter (a missing flag counts as GPU)."""
    if "interpreter" not in df.columns:
        return pd.Series(False, index=df.index, dtype=bool)
    return df["interpreter"].map(lambda v: bool(v) if v is not None and not _is_missing(v) else False).astype(bool)


def interpreter_caption(df: pd.DataFrame) -> str | None:
    """The warning to show with a table built from ``df``, or None when no row came from the interpreter."""
    if df.empty:
        return None
    return INTERPRETER_CAPTION if interpreter_rows(df).any() else None


def is_interpreter_run(df: pd.DataFrame) -> bool:
    """True when every row of ``df`` (at least one) came from the interpreter."""
    return not df.empty and bool(interpreter_rows(df).all())


def _is_missing(v: object) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):  # lists, dicts: not a scalar, so not missing
        return False


def _reported_phase(df: pd.DataFrame) -> pd.Series:
    """Per row: False for a tune's screening, default and check timings, which rank or gauge candidates; a
    tune's ``final`` re-timings (the kept candidates, the chosen config among them) and every sweep row stay."""
    if "phase" not in df.columns:
        return pd.Series(True, index=df.index, dtype=bool)
    return df["phase"].map(lambda v: not isinstance(v, str) or v == "final").astype(bool)


def best_ok_points(df: pd.DataFrame, checked: bool = False) -> pd.DataFrame:
    """Status-ok rows, one per (model, dtype, M, path): the fastest where a run holds several.

    Several rows per point come from tile configs tried while tuning or from
    several routing distributions; the table shows what the path achieved (of a tune, its final re-timings:
    a screening timing is too short to report).
    With ``checked``, interpreter rows that failed their check stay too (after any ok row of
    their point): what an interpreter run shows is whether each point is correct.
    """
    keep = (df["status"] == "ok") & _reported_phase(df)
    if checked:
        keep |= (df["status"] == "incorrect") & interpreter_rows(df)
    ok = df[keep]
    ok = ok.sort_values("time_us", na_position="last", kind="stable")
    return ok.drop_duplicates(subset=_POINT, keep="first")


def throughput_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, dtype, M, path) of the status-ok rows, with the decode token rate.

    ``decode_tok_s = M / (moe_layers * time_us * 1e-6)``: tokens per second through
    the model's whole MoE layer stack, counting MoE time only.
    Where rows come from the interpreter, ``correct`` and ``rel_err`` follow, the points that
    failed their check are listed too, and those rows' throughput figures are empty; when every
    row did, ``attrs["people_columns"]`` names what a rendering for people shows (INTERPRETER_VIEW).
    """
    interp = interpreter_rows(df)
    best = best_ok_points(df, checked=bool(interp.any()))
    out = best.assign(
        decode_tok_s=best["M"] / (best["moe_layers"] * best["time_us"].astype(float) * 1e-6)
    )
    columns = list(THROUGHPUT_COLUMNS)
    if interp.any():
        out[_GPU_FIGURES] = out[_GPU_FIGURES].astype(float)
        out.loc[interpreter_rows(out), _GPU_FIGURES] = float("nan")
        columns += CHECK_COLUMNS
    out = out.sort_values(_POINT, kind="stable")[columns].reset_index(drop=True)
    out.attrs["caption"] = interpreter_caption(df)
    if is_interpreter_run(df):
        out.attrs["people_columns"] = INTERPRETER_VIEW
    return out


def prefill_ttft_table(df: pd.DataFrame) -> pd.DataFrame:
    """The TTFT table the CLI prints: GPU rows at prefill-sized M (>= 128) only, else empty.

    A 1-token layer is no time-to-first-token, and interpreter timings are no GPU time.
    """
    gpu = df[~interpreter_rows(df)]
    lens = sorted({int(m) for m in best_ok_points(gpu)["M"] if m >= _PROMPT_MIN})
    if not lens:
        return pd.DataFrame(columns=TTFT_COLUMNS)
    return ttft_table(gpu, prompt_lens=lens)


def ttft_table(df: pd.DataFrame, prompt_lens: list[int] | None = None) -> pd.DataFrame:
    """The MoE share of time-to-first-token: ``moe_layers * time_us(M=P) / 1000`` ms per prompt length P.

    Prefilling a P-token prompt runs every MoE layer once on M = P tokens. Default
    prompt lengths: the measured M values >= 128, or all measured M if none is.
    A requested length that no point measured is a UserError (nothing is interpolated);
    a (model, dtype, path) that lacks a requested length has no row for it.
    """
    best = best_ok_points(df)
    measured = sorted({int(m) for m in best["M"]})
    if prompt_lens is None:
        prompt_lens = [m for m in measured if m >= _PROMPT_MIN] or measured
    else:
        missing = sorted({int(p) for p in prompt_lens} - set(measured))
        if missing:
            raise UserError(
                f"prompt length {missing[0]} was not measured; measured M: "
                f"{', '.join(map(str, measured)) or 'none'}"
            )
    rows = best[best["M"].isin(prompt_lens)]
    out = pd.DataFrame({
        "model": rows["model"],
        "dtype": rows["dtype"],
        "path": rows["path"],
        "prompt_len": rows["M"].astype(int),
        "moe_ttft_ms": rows["moe_layers"] * rows["time_us"].astype(float) / 1000.0,
    }, columns=TTFT_COLUMNS)
    out = out.sort_values(["model", "dtype", "path", "prompt_len"], kind="stable").reset_index(drop=True)
    out.attrs["caption"] = interpreter_caption(df) or TTFT_NOTE
    return out


COLD_START_COLUMNS = ["model", "dtype", "cache", "requests", "distinct_m", "variants_compiled",
                      "compiles_after_20", "latency_p99_ms", "warm_p99_ms", "total_excess_s", "run"]
COLD_START_NOTE = ("cold start, from `moebench trace`: one MoE layer's first call per request minus the same "
                   "request replayed warm: compilation, loading from Triton's disk cache and first launches of "
                   "the MoE kernels on one GPU. A model's MoE layers share these kernels, so this is paid once, "
                   "not per layer; it excludes the rest of the model's kernels.")


def cold_start_table(traces: list) -> pd.DataFrame:
    """Per trace run (``runs.Run`` of kind "trace"): its cache mode and the summary of its requests
    (``trace.summarize`` of the rows, so the table and the trace's own output agree)."""
    from moebench.report.trace_summary import summarize

    records = []
    for run in traces:
        m = run.meta
        cache = m.get("cache_mode", "?") + (", specialized" if m.get("specialize") else "")
        summary = summarize(run.rows.to_dict("records"))
        records.append({"model": m.get("model"), "dtype": m.get("dtype"), "cache": cache, "run": run.label,
                        **{k: summary.get(k) for k in COLD_START_COLUMNS if k in summary}})
    out = pd.DataFrame(records, columns=COLD_START_COLUMNS)
    interp = any(run.meta.get("interpreter") for run in traces)
    out.attrs["caption"] = (INTERPRETER_CAPTION + "; the interpreter compiles nothing") if interp else COLD_START_NOTE
    return out


GAINS_COLUMNS = ["model", "dtype", "M", "time_us", "pct_of_floor", "config", "swap_gain", "fp8_gain",
                 "vs_cutlass"]


def _short_config(c: dict) -> str:
    """A row's tile config as the gains table prints it (``tile.short_label``)."""
    from moebench.tile import short_label

    return short_label(c)


def gains_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per point of the triton path: its best time and config, and three ratios (> 1: the first is faster).

    ``swap_gain`` = best no-swap time / best Swap-AB time (needs a tuned run with both);
    ``fp8_gain`` = the same model and M in bf16 / this fp8 time; ``vs_cutlass`` = cutlass / triton time.
    Where the rows carry a ``commit`` (the git commit of their run) and the best rows come from more than
    one, a last column names each point's, so a table drawn from several runs says which kernels made it.
    """
    ok = df[(df["status"] == "ok") & df["time_us"].notna() & _reported_phase(df)]
    tri = ok[ok["path"] == "triton"]
    if tri.empty:
        return pd.DataFrame(columns=GAINS_COLUMNS)
    key = ["model", "dtype", "M"]
    swap = tri["config"].map(lambda c: bool(isinstance(c, dict) and c.get("swap_ab")))
    best = tri.sort_values("time_us", kind="stable").drop_duplicates(key).set_index(key)
    plain = tri[~swap].groupby(key)["time_us"].min()
    swapped = tri[swap].groupby(key)["time_us"].min()
    cutlass = ok[ok["path"] == "cutlass"].groupby(key)["time_us"].min()
    bf16 = best.xs("bf16", level="dtype")["time_us"] if "bf16" in best.index.get_level_values("dtype") else None
    out = pd.DataFrame({
        "time_us": best["time_us"].astype(float),
        "pct_of_floor": best["pct_of_floor"],
        "config": best["config"].map(lambda c: _short_config(c) if isinstance(c, dict) else None),
        "swap_gain": plain.reindex(best.index) / swapped.reindex(best.index),
        "vs_cutlass": cutlass.reindex(best.index) / best["time_us"],
    })
    out["fp8_gain"] = [
        bf16.get((model, m), float("nan")) / t if bf16 is not None and dtype.startswith("fp8") else float("nan")
        for (model, dtype, m), t in out["time_us"].items()
    ]
    columns = list(GAINS_COLUMNS)
    if "commit" in best.columns and best["commit"].nunique() > 1:
        out["commit"] = best["commit"]
        columns.append("commit")
    out = out.reset_index().sort_values(key, kind="stable").reset_index(drop=True)[columns]
    out.attrs["caption"] = interpreter_caption(df)
    return out


def geomean_pct_of_floor(gains: pd.DataFrame) -> tuple[float, float]:
    """(geometric mean, minimum) of pct_of_floor over the points of a gains table."""
    pct = gains["pct_of_floor"].dropna().astype(float)
    if pct.empty:
        return float("nan"), float("nan")
    return float(np.exp(np.log(pct).mean())), float(pct.min())


# ---- rendering ----------------------------------------------------------------------------------

def _fixed(decimals: int, suffix: str = "") -> Callable[[float], str]:
    return lambda v: f"{v:,.{decimals}f}{suffix}"


# How people read each column; columns not listed fall back on their Python type.
_COLUMN_FORMATS: dict[str, Callable[[float], str]] = {
    "pct_of_floor": _fixed(1, "%"),
    "tflops": _fixed(1),
    "gbps": _fixed(0),
    "decode_tok_s": _fixed(0),
    "ratio": lambda v: f"{v:.3f}",
    "noise": lambda v: f"±{100 * v:.1f}%",
    "rel_err": lambda v: f"{v:.2e}",
    "swap_gain": _fixed(2, "x"),
    "fp8_gain": _fixed(2, "x"),
    "vs_cutlass": _fixed(2, "x"),
    "speedup": lambda v: f"{v:.3f}x",
}
_VERDICT_STYLES = {"FASTER": "bold green", "SLOWER": "bold red", "SAME": "dim", "UNKNOWN": "yellow",
                   "CORRECT": "dim", "FIXED": "bold green", "BROKEN": "bold red", "INCORRECT": "red"}


def format_cell(column: str, value: object) -> str:
    """A value as people read it: times to 0.1 us, % to 0.1, big rates with separators, '-' if absent."""
    if value is None or _is_missing(value):
        return "-"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, numbers.Real):
        if column in _COLUMN_FORMATS:
            return _COLUMN_FORMATS[column](float(value))
        if column.endswith("_us"):
            return f"{float(value):,.1f}"
        if column.endswith("_ms"):
            return f"{float(value):,.2f}"
        if isinstance(value, numbers.Integral):
            return str(int(value))
        return f"{float(value):.4g}"
    return str(value)


def _is_numeric_column(table: pd.DataFrame, column: str) -> bool:
    """Numbers only (missing values aside): right-justified."""
    present = [v for v in table[column] if v is not None and not _is_missing(v)]
    return all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in present)


def _json_value(v: object) -> object:
    """Plain JSON values: numpy scalars unwrapped, NaN / inf / None as null."""
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or (isinstance(v, float) and not math.isfinite(v)) or _is_missing(v):
        return None
    return v


def render(
    table: pd.DataFrame, fmt: str, title: str, console: Console | None = None, caption: str | None = None,
) -> str | None:
    """Render ``table`` for people ("table": printed to ``console``, returns None) or programs.

    "csv" returns ``table.to_csv(index=False)``; "json" returns a JSON array of
    records with NaN as null. Both keep the DataFrame's column names; a rich table
    shows only ``attrs["people_columns"]`` where the table names them. ``caption``
    (default: the table's ``attrs["caption"]``, which the table functions set to
    the interpreter warning when it applies; "" prints none) is printed on its own
    line under a rich table.
    """
    if fmt == "csv":
        return table.to_csv(index=False)
    if fmt == "json":
        columns = [str(c) for c in table.columns]
        records = [
            {c: _json_value(v) for c, v in zip(columns, rec, strict=True)}
            for rec in table.itertuples(index=False, name=None)
        ]
        return json.dumps(records, allow_nan=False, default=str)
    if fmt != "table":
        raise ValueError(f"render: unknown format {fmt!r}")  # the commands offer only cli.console.FORMATS
    if caption is None:
        caption = table.attrs.get("caption")
    if people := table.attrs.get("people_columns"):
        table = table[list(people)]
    console = console if console is not None else Console()
    rich_table = Table(title=title, title_justify="left")
    for column in table.columns:
        justify = "right" if _is_numeric_column(table, column) else "left"
        rich_table.add_column(Text(str(column)), justify=justify)
    for record in table.itertuples(index=False, name=None):
        cells = []
        for column, value in zip(table.columns, record, strict=True):
            text = format_cell(str(column), value)
            cells.append(Text(text, style=_VERDICT_STYLES.get(text, "") if column == "verdict" else ""))
        rich_table.add_row(*cells)
    console.print(rich_table)
    if caption:
        # A line of its own rather than rich's caption, which wraps to the table's width.
        console.print(Text(caption, style="bold yellow"))
    return None
