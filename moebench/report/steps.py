"""What the reports show of step runs (``moebench step``): its four tables, and two sides' composed steps compared.

    step rows -> report.compose per run (with its own --vs) -> step_tables / run_tables: ttft, decode, stack, parts
    a side's runs -> step_points: per run, each composed step as a point (its time, and the same sum with every
        measured part at its 20th / 80th percentile) -> compare.compare_runs / check_table on STEP_KEY

The tables are the ones ``moebench step`` prints at its end, from the same functions (``report.compose``), so the
command and the report cannot disagree. Importing this module loads no pandas: the command line reads
STEP_TABLES for its choices.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from moebench.errors import UserError
from moebench.report import compose
from moebench.store.step_rows import STEP_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

    from moebench.report.runs import Run

STEP_TABLES = ("ttft", "decode", "stack", "parts")
SHOWN = ("ttft", "decode", "stack")  # what a step's output shows without --table
# What people see of the parts table (csv and json carry every column of STEP_COLUMNS).
PARTS_VIEW = ["model", "dtype", "phase", "batch", "length", "part", "path", "count", "status", "rel_err", "time_us",
              "pct_of_floor", "measured"]
STEP_KEY = ("model", "dtype", "path", "phase", "batch", "length")  # a composed step: one path at one point
STEP_COMPARE_COLUMNS = [*STEP_KEY, "base_ms", "new_ms", "ratio", "noise", "verdict"]
_PHASE_ORDER = {"prefill": 0, "decode": 1}
COLD_COLUMNS = ["model", "dtype", "path", "batch", "prompt", "cache", "warm_ttft_ms", "first_compile_ms",
                "cold_ttft_ms", "compile_first_20_ms", "compile_after_20_ms", "ttft_after_20_ms", "trace"]
COLD_NOTE = ("cold start: the step's warm TTFT plus the compile time a trace (moebench trace: the triton path's MoE "
             "kernels from an empty Triton cache) measured for its first request, and per request on average among "
             "the first 20 and after them. The MoE layers share those kernels, so each compile is paid once, not per "
             "layer; the other parts' kernels are not counted.")
EARLY = 20  # requests counted as the first ones of a cold start


# ---- the tables ---------------------------------------------------------------------------------------------

def records(run: Run) -> list[dict]:
    """A step run's rows as the records ``report.compose`` reads (missing values None, as written)."""
    return run.rows.to_dict("records")


def step_tables(rows: list[dict], vs: str | None = None) -> dict[str, pd.DataFrame]:
    """The tables of one step run's ``rows`` (``vs``: the path the others are set against), by name (STEP_TABLES):
    ttft and decode (``compose.compose``'s steps), stack (the composition check), parts (the rows, STEP_COLUMNS;
    ``attrs["people_columns"]`` names what a rendering for people shows). Each carries the interpreter warning as
    its ``attrs["caption"]`` where a row came from the CPU interpreter."""
    return _frames(compose.compose(rows, vs), rows)


def run_tables(runs: Sequence[Run]) -> dict[str, pd.DataFrame]:
    """``step_tables`` of several step runs taken together, each run composed with its own ``vs``; UserError where
    two runs measured the same step (their rows are one run's, or they are to be compared)."""
    check_disjoint(runs)
    steps, rows = [], []
    for run in runs:
        these = records(run)
        steps += compose.compose(these, run.meta.get("vs"))
        rows += these
    return _frames(steps, rows)


def _frames(steps: list[dict], rows: list[dict]) -> dict[str, pd.DataFrame]:
    import pandas as pd

    from moebench.report.tables import INTERPRETER_CAPTION

    tables = {"ttft": pd.DataFrame(compose.ttft_records(steps), columns=compose.TTFT_COLUMNS),
              "decode": pd.DataFrame(compose.decode_records(steps), columns=compose.DECODE_COLUMNS),
              "stack": pd.DataFrame(compose.stack_records(rows), columns=compose.STACK_COLUMNS),
              "parts": pd.DataFrame(rows, columns=list(STEP_COLUMNS))}
    caption = INTERPRETER_CAPTION if any(r.get("interpreter") for r in rows) else None
    for table in tables.values():
        table.attrs["caption"] = caption
    tables["parts"].attrs["people_columns"] = PARTS_VIEW
    return tables


def check_disjoint(runs: Sequence[Run]) -> None:
    """UserError where two of ``runs`` hold the same composed step (STEP_KEY): their rows would be summed as one."""
    seen: dict[tuple, str] = {}
    for run in runs:
        for r in records(run):
            if r["part"] != "moe":
                continue
            key = tuple(r[k] for k in STEP_KEY)
            if seen.setdefault(key, run.label) != run.label:
                model, dtype, path, phase, batch, length = key
                raise UserError(f"step runs {seen[key]} and {run.label} both measured {model} {dtype} {path} {phase} "
                                f"batch={batch} length={length}: read them one at a time, or compare them "
                                "(moebench compare BASE NEW)")


def title_label(tables: dict[str, pd.DataFrame]) -> tuple[str, bool]:
    """What the tables' titles name (``"tiny fp16"``, or each model and dtype) and whether there is one model and
    dtype only (a rendering for people then leaves their columns out)."""
    parts = tables["parts"]
    pairs = list(dict.fromkeys(zip(parts["model"], parts["dtype"], strict=True)))
    return ", ".join(f"{m} {d}" for m, d in pairs), len(pairs) == 1


def people_view(table: pd.DataFrame, single: bool) -> pd.DataFrame:
    """What people see of ``table``: its ``people_columns`` where set, without model and dtype where ``single``
    (the title names them); no attrs, so the view renders as it is."""
    columns = [c for c in table.attrs.get("people_columns") or table.columns
               if not (single and c in ("model", "dtype"))]
    view = table[columns].copy()
    view.attrs = {}
    return view


def notes(rows: list[dict]) -> list[str]:
    """What was modelled about the parts (their rows' ``note``), each once, sorted; the stack's note is its table's."""
    return sorted({r["note"] for r in rows if r.get("note") and r["part"] != "stack"})


def cold_start_table(ttft: pd.DataFrame, traces: Sequence[Run]) -> pd.DataFrame:
    """Per trace run and each prefill step of the same model and dtype on the triton path (the path a trace
    replays) in ``ttft`` (``step_tables``' ttft): the warm TTFT, the first request's TTFT from an empty cache (warm
    plus that request's compile excess) and the mean excess a request pays among the first ``EARLY`` and after.
    UserError where a trace's model and dtype match no step."""
    import pandas as pd

    records = []
    for run in traces:
        m = run.meta
        excess = [float(x) for x in run.rows.sort_values("i")["excess_ms"] if x == x and x is not None]
        if not excess:
            continue
        early, late = excess[:EARLY], excess[EARLY:]
        late_mean = sum(late) / len(late) if late else None
        match = ttft[(ttft["model"] == m.get("model")) & (ttft["dtype"] == m.get("dtype")) & (ttft["path"] == "triton")]
        if match.empty:
            raise UserError(f"trace {run.label} is of {m.get('model')} {m.get('dtype')}: no step run named has its "
                            "prefill steps on the triton path")
        cache = m.get("cache_mode", "?") + (", specialized" if m.get("specialize") else "")
        for r in match.to_dict("records"):
            warm = r["ttft_ms"] if r["ttft_ms"] == r["ttft_ms"] else None
            records.append({"model": r["model"], "dtype": r["dtype"], "path": "triton", "batch": r["batch"],
                            "prompt": r["prompt"], "cache": cache, "warm_ttft_ms": warm,
                            "first_compile_ms": excess[0], "cold_ttft_ms": None if warm is None else warm + excess[0],
                            "compile_first_20_ms": sum(early) / len(early), "compile_after_20_ms": late_mean,
                            "ttft_after_20_ms": None if warm is None or late_mean is None else warm + late_mean,
                            "trace": run.label})
    out = pd.DataFrame(records, columns=COLD_COLUMNS)
    out.attrs["caption"] = COLD_NOTE
    return out


# ---- comparing two sides ------------------------------------------------------------------------------------

def step_points(runs: Sequence[Run]) -> pd.DataFrame:
    """Each run's composed steps as the points ``report.compare`` reads, one row per run and STEP_KEY: ``time_us``
    the step's TTFT or per-token time (measured parts plus modelled all-reduces, ``compose.compose``), and
    ``time_p20_us`` / ``time_p80_us`` the same sum with every measured part at its 20th / 80th percentile: the
    spread of the step if its parts moved together, at least the spread of the sum (None where a part recorded
    none: noise unknown). ``status``: ok, else of the parts it lacks the first of incorrect, error, unsupported,
    missing (no row). ``interpreter`` and ``device_name`` are its rows'."""
    import pandas as pd

    out = []
    for run in runs:
        rows = records(run)
        at = {q: {_key(s): s for s in compose.compose(_at_percentile(rows, q))} for q in ("p20", "p80")}
        by_part = {(*(r[k] for k in ("model", "dtype", "phase", "batch", "length")), r["part"], r["path"]): r
                   for r in rows}
        for s in compose.compose(rows):
            key = _key(s)
            out.append({**dict(zip(STEP_KEY, key, strict=True)), "run": run.label,
                        "status": _status(s, by_part), "time_us": compose.total_us(s),
                        "time_p20_us": compose.total_us(at["p20"][key]),
                        "time_p80_us": compose.total_us(at["p80"][key]),
                        "interpreter": bool(run.interpreter), "device_name": run.device})
    return pd.DataFrame(out, columns=[*STEP_KEY, "run", "status", "time_us", "time_p20_us", "time_p80_us",
                                      "interpreter", "device_name"])


def _key(s: dict) -> tuple:
    return tuple(s[k] for k in STEP_KEY)


def _at_percentile(rows: list[dict], q: str) -> list[dict]:
    """``rows`` with each measured part's time at its percentile ``q`` (the modelled all-reduces keep theirs)."""
    return [{**r, "time_us": r[f"time_{q}_us"]} if r["measured"] else r for r in rows]


def _status(step: dict, by_part: dict) -> str:
    """ok where the step has a time, else the gravest status of the parts it lacks."""
    if not step["missing"]:
        return "ok"
    point = tuple(step[k] for k in ("model", "dtype", "phase", "batch", "length"))
    found = {(by_part.get((*point, p, step["path"] if p == "moe" else None)) or {}).get("status", "missing")
             for p in step["missing"].split(",")}
    return next((s for s in ("incorrect", "error", "unsupported") if s in found), "missing")


def compare_steps(base: pd.DataFrame, new: pd.DataFrame, min_threshold: float = 0.03) -> pd.DataFrame:
    """Two sides' ``step_points`` step by step: the base's and the new TTFT or per-token time (ms, the median over
    a side's runs), ``ratio = new / base`` and a verdict against both sides' noise (``compare.compare_runs``:
    the spread within a run as ``step_points`` composes it, and between a side's runs)."""
    from moebench.report.compare import compare_runs

    table = compare_runs(base, new, min_threshold=min_threshold, key=STEP_KEY)
    table = table.assign(base_ms=table["base_us"] / 1000, new_ms=table["new_us"] / 1000)
    return _in_order(table)[STEP_COMPARE_COLUMNS]


def check_steps(base: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Interpreter runs: per composed step both ran, whether every part passed its check on each side and a
    verdict (``compare.CHECK_VERDICTS``). No speed is compared."""
    from moebench.report.compare import check_table

    return _in_order(check_table(base, new, key=STEP_KEY))


def unmatched_steps(base: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """The composed steps with a time on one side only (``only_in``: "base" or "new")."""
    from moebench.report.compare import unmatched

    return _in_order(unmatched(base, new, key=STEP_KEY))


def _in_order(table: pd.DataFrame) -> pd.DataFrame:
    """Prefill before decode, then by path and point, as the step's own tables read."""
    order = ["model", "dtype", "phase", "path", "batch", "length"]
    ranked = table.sort_values(order, key=lambda c: c.map(lambda p: _PHASE_ORDER.get(p, 2)) if c.name == "phase"
                               else c, kind="stable")
    return ranked.reset_index(drop=True)
