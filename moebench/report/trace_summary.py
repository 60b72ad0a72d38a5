"""What a report shows of a trace run (``moebench trace``): the summary of its requests, one row per kernel
variant built, one row per request. Read from the run folder's rows; ``serve.trace`` writes them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moebench.store.rows import TRACE_REQUEST_COLUMNS

AFTER = 20  # the summary counts compiles after this many requests: a warmed server should have none
EVENT_COLUMNS = ["i", "M", "kernel", "seconds", "from_disk"]
INTERPRETER_NOTE = ("interpreter: Triton's interpreter compiles nothing, so no compiles are counted (not 0 "
                    "measured); latencies are CPU times, not GPU performance")


def summarize(rows: list[dict], after: int = AFTER) -> dict:
    """A replay's summary from its rows: requests, distinct M, variants compiled (and those after the first
    ``after`` requests, and loaded from disk), latency and warm percentiles (ms), total excess (s). The
    compile figures are None where the rows counted none (the interpreter)."""
    df = pd.DataFrame(rows)
    counted = not df.empty and df["compiles"].notna().all()
    disk = [d for r in rows for d in (r.get("from_disk") or []) if d is not None]

    def pct(col: str, q: float) -> float | None:
        return float(np.percentile(df[col].astype(float), q)) if not df.empty else None

    return {
        "requests": len(df), "distinct_m": int(df["M"].nunique()) if not df.empty else 0,
        "variants_compiled": int(df["compiles"].sum()) if counted else None,
        f"compiles_after_{after}": int(df.loc[df["i"] >= after, "compiles"].sum()) if counted else None,
        "loaded_from_disk": sum(disk) if counted and disk else (0 if counted else None),
        "latency_p50_ms": pct("latency_ms", 50), "latency_p99_ms": pct("latency_ms", 99),
        "latency_max_ms": float(df["latency_ms"].max()) if not df.empty else None,
        "warm_p50_ms": pct("warm_ms", 50), "warm_p99_ms": pct("warm_ms", 99),
        "warm_max_ms": float(df["warm_ms"].max()) if not df.empty else None,
        "total_excess_s": float(df["excess_ms"].clip(lower=0).sum() / 1e3) if not df.empty else 0.0,
    }


def events_table(rows: list[dict]) -> pd.DataFrame:
    """One row per kernel variant built: the request (i), its M, the kernel, seconds, from_disk."""
    events = [{"i": r["i"], "M": r["M"], "kernel": k, "seconds": s, "from_disk": d}
              for r in rows for k, s, d in zip(r.get("compile_kernels") or [], r.get("compile_s") or [],
                                               r.get("from_disk") or [], strict=False)]
    return pd.DataFrame(events, columns=EVENT_COLUMNS)


def requests_table(rows: list[dict]) -> pd.DataFrame:
    """One row per request (``TRACE_REQUEST_COLUMNS``), the compiled kernels' names joined by spaces."""
    df = pd.DataFrame(rows, columns=list(TRACE_REQUEST_COLUMNS))
    df["compile_kernels"] = df["compile_kernels"].map(lambda ks: " ".join(ks) if isinstance(ks, list) else None)
    return df
