"""Throughput and TTFT tables from a run's rows, rendered for people (rich) or programs (csv, json).

The table functions return plain DataFrames with stable column names; ``render``
turns any of them (or a ``compare`` table) into a rich table, CSV or JSON, so a
person and a program read the same numbers.

Rows from a CPU-interpreter run are marked: their timings say nothing about GPU
performance, and every rendering for people says so (``interpreter_caption``).
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
FORMATS = ("table", "csv", "json")

THROUGHPUT_COLUMNS = [
    "model", "dtype", "M", "path", "time_us", "pct_of_floor", "tflops", "gbps", "decode_tok_s",
]
TTFT_COLUMNS = ["model", "dtype", "path", "prompt_len", "moe_ttft_ms"]

_POINT = ["model", "dtype", "M", "path"]
_PROMPT_MIN = 128  # default TTFT prompt lengths: the measured M at or above this (prefill-sized)


def interpreter_caption(df: pd.DataFrame) -> str | None:
    """The warning to show with a table built from ``df``, or None when no row came from the interpreter."""
    if "interpreter" not in df.columns or df.empty:
        return None
    flags = df["interpreter"].map(lambda v: bool(v) if v is not None and not _is_missing(v) else False)
    return INTERPRETER_CAPTION if flags.any() else None


def _is_missing(v: object) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):  # lists, dicts: not a scalar, so not missing
        return False


def _best_ok_points(df: pd.DataFrame) -> pd.DataFrame:
    """Status-ok rows, one per (model, dtype, M, path): the fastest where a run holds several.

    Several rows per point come from tile configs tried while tuning or from
    several routing distributions; the table shows what the path achieved.
    """
    ok = df[df["status"] == "ok"]
    ok = ok.sort_values("time_us", na_position="last", kind="stable")
    return ok.drop_duplicates(subset=_POINT, keep="first")


def throughput_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, dtype, M, path) of the status-ok rows, with the decode token rate.

    ``decode_tok_s = M / (moe_layers * time_us * 1e-6)``: tokens per second through
    the model's whole MoE layer stack, counting MoE time only.
    """
    best = _best_ok_points(df)
    out = best.assign(
        decode_tok_s=best["M"] / (best["moe_layers"] * best["time_us"].astype(float) * 1e-6)
    )
    out = out.sort_values(_POINT, kind="stable")[THROUGHPUT_COLUMNS].reset_index(drop=True)
    out.attrs["caption"] = interpreter_caption(df)
    return out


def ttft_table(df: pd.DataFrame, prompt_lens: list[int] | None = None) -> pd.DataFrame:
    """The MoE share of time-to-first-token: ``moe_layers * time_us(M=P) / 1000`` ms per prompt length P.

    Prefilling a P-token prompt runs every MoE layer once on M = P tokens. Default
    prompt lengths: the measured M values >= 128, or all measured M if none is.
    A requested length that no point measured is a UserError (nothing is interpolated);
    a (model, dtype, path) that lacks a requested length has no row for it.
    """
    best = _best_ok_points(df)
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
    out.attrs["caption"] = interpreter_caption(df)
    return out


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
}
_VERDICT_STYLES = {"FASTER": "bold green", "SLOWER": "bold red", "SAME": "dim"}


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
    records with NaN as null. Both keep the DataFrame's column names. ``caption``
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
        raise UserError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if caption is None:
        caption = table.attrs.get("caption")
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
