"""``moebench fit-check``: the fitted default (``tables.fitted``) checked leave-one-shape-out on the tuned tables,
and the points a GPU times it at (``audit.fittime``).

tables -> for each table, the fit over the tables of its device but those of its shape (``Fit.without``) ->
per key M: the fitted config (or the heuristic, where no tuned point is near enough) beside the table's ->
where a recorded run timed both at M on that shape, their ratio (``recorded_times``) -> ``Check`` lines.
``points`` lists, for the served entries at vLLM's token counts, what a GPU run times back to back: the
fitted config (held out where the shape has a table), the tuned table's config, moebench's heuristic and the
engines' untuned default (``kernels.classic.default_config``, run on the triton-classic path).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from moebench.hardware import HOPPER, DeviceLimits
from moebench.tables.fitted import CLASS_OF, OPERAND_BYTES, Fit, Fitted, Tuned, Where, fit_of
from moebench.tile import TileConfig

POINTS_FORMAT, POINTS_VERSION = "moebench-fit-points", 1
# The phases a tune's rows are timed in, as two budgets: a time is compared only with one of the same budget.
BUDGETS = {"screen": "screen", "final": "final", "default": "final"}


def heuristic(where: Where, dtype: str, limits: DeviceLimits = HOPPER) -> TileConfig:
    """moebench's hand-written default at ``where`` (``tile.default_config``), as the triton path runs it."""
    from moebench.dtypes import get_dtype
    from moebench.tile import default_config

    nbytes = OPERAND_BYTES.get(CLASS_OF.get(dtype, ""), 4)
    return default_config(where.M, where.experts, where.topk, nbytes, get_dtype(dtype).fp8_scheme, limits)


def fitted_or_heuristic(fit: Fit, where: Where, dtype: str, limits: DeviceLimits = HOPPER
                        ) -> tuple[TileConfig, Fitted | None]:
    """What the lookup runs without a table: the fit's config, else the heuristic; and the fit's answer."""
    fitted = fit.predict(where, dtype, limits)
    return (fitted.config if fitted else heuristic(where, dtype, limits)), fitted


# ---- recorded timings ------------------------------------------------------------------------------------

def recorded_times(runs: Iterable[Path], table: Tuned) -> dict[tuple[str, int, tuple], float]:
    """(budget, M, config key) -> the median time of the rows of ``runs`` (run folders) that ran ``table``'s
    shape, dtype and device on moebench's kernel. Folders that are not runs are passed over."""
    from moebench.errors import UserError
    from moebench.store.runfolder import read_rows, rows_file

    times: dict[tuple[str, int, tuple], list[float]] = defaultdict(list)
    want = {"experts": table.experts, "intermediate": table.intermediate, "hidden": table.hidden,
            "topk": table.topk, "dtype": table.dtype, "path": "triton"}
    device = table.device_name.replace("_", " ")
    for run in dict.fromkeys(Path(r) for r in runs):
        try:
            rows, _ = read_rows(rows_file(run))
        except (UserError, OSError):
            continue
        for r in rows:
            budget = BUDGETS.get(r.get("phase"))
            if (budget is None or r.get("status") != "ok" or r.get("time_us") is None or not r.get("config")
                    or any(r.get(k) != v for k, v in want.items())
                    or str(r.get("device_name", "")).replace("_", " ") != device):
                continue
            times[(budget, int(r["M"]), TileConfig.from_dict(r["config"]).key())].append(float(r["time_us"]))
    return {k: statistics.median(v) for k, v in times.items()}


def ratio(times: dict, M: int, a: TileConfig, b: TileConfig) -> tuple[float | None, str | None]:
    """(time of ``a`` / time of ``b`` at M, the budget both were timed at), the final budget first; (None, None)
    where no budget has both."""
    for budget in ("final", "screen"):
        ta, tb = times.get((budget, M, a.key())), times.get((budget, M, b.key()))
        if ta and tb:
            return ta / tb, budget
    return None, None


# ---- leave one shape out ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    """One key M of a held-out table: the config the fit predicts without the table's shape, the table's own,
    and their recorded time ratio where a run timed both (``budget`` says at which budget)."""

    table: Tuned
    M: int
    predicted: TileConfig
    fitted: Fitted | None  # None: no tuned point near enough, the heuristic runs
    tuned: TileConfig
    ratio: float | None = None
    budget: str | None = None

    @property
    def source(self) -> str:
        return self.fitted.label if self.fitted else "heuristic"

    def as_row(self) -> dict:
        t = self.table
        return {"table": t.name, "experts": t.experts, "intermediate": t.intermediate, "hidden": t.hidden,
                "topk": t.topk, "dtype": t.dtype, "M": self.M, "predicted": self.predicted.label,
                "source": self.source, "distance": None if self.fitted is None else round(self.fitted.distance, 3),
                "tuned": self.tuned.label, "same": self.predicted.key() == self.tuned.key(), "ratio": self.ratio,
                "budget": self.budget}


def source_runs(table: Tuned, root: Path | None = None) -> list[Path]:
    """The run folder a table names as its source (``source_run``, relative to ``root``; by default the current
    folder, else the checkout the shipped tables are in), where it is there."""
    from moebench.tables.formats.moebench import load_table
    from moebench.tables.lookup import SHIPPED_DIR

    if table.path is None:
        return []
    run = load_table(table.path)[0].source_run
    if not run:
        return []
    roots = [root] if root is not None else [Path.cwd(), SHIPPED_DIR.parents[2]]  # the checkout: moebench/tables/
    return next(([r / run] for r in roots if (r / run).is_dir()), [])


def leave_one_out(tables: Sequence[Tuned], runs: Iterable[Path] = (), limits: DeviceLimits = HOPPER,
                  root: Path | None = None) -> list[Check]:
    """Per table (by name) and key M, the config the fit over the tables of its device but those of its shape
    predicts, beside the table's, with the ratio of their times where ``runs`` (and the table's own source run)
    timed both on that shape."""
    runs = list(runs)
    out = []
    for t in sorted(tables, key=lambda t: t.name):
        held = fit_of(tables, t.device_name).without(t.shape)
        times = recorded_times([*source_runs(t, root), *runs], t)
        for M, tuned in t.table.items():
            predicted, fitted = fitted_or_heuristic(held, t.at(M), t.dtype, limits)
            r, budget = ratio(times, M, predicted, tuned)
            out.append(Check(t, M, predicted, fitted, tuned, r, budget))
    return out


def geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


# ---- the points a GPU times ------------------------------------------------------------------------------

def points(tables: Sequence[Tuned], device_name: str, entries=None, ms: Sequence[int] | None = None,
           limits: DeviceLimits = HOPPER) -> list[dict]:
    """One dict per served entry (``tune.served.SERVED`` unless given) and M (vLLM's 18 unless given): its shape
    and dtype; ``fitted``, what the lookup runs without the entry's shape's tables (the fit held out, else the
    heuristic) and ``fitted_from``; ``table``, the config the entry's table of ``device_name`` gives at M (None
    where it has none); ``heuristic``; ``classic``, the engines' untuned default for the triton-classic path."""
    from moebench.dtypes import get_dtype
    from moebench.kernels.classic import default_config as classic_default
    from moebench.space.declared import VLLM_MS
    from moebench.tune.served import SERVED

    fit = fit_of(tables, device_name)
    out = []
    for e in SERVED if entries is None else entries:
        s = e.shape
        held = fit.without((s.experts, s.intermediate, s.hidden, s.topk))
        own = next((t for t in fit.tables if t.shape == (s.experts, s.intermediate, s.hidden, s.topk)
                    and t.dtype == e.dtype), None)
        for M in VLLM_MS if ms is None else ms:
            where = Where(M, s.experts, s.topk, s.hidden, s.intermediate)
            predicted, fitted = fitted_or_heuristic(held, where, e.dtype, limits)
            key = own.table.nearest_key(M) if own else None
            out.append({
                "model": e.model, "tp": e.tp, "dtype": e.dtype, "experts": s.experts, "intermediate": s.intermediate,
                "hidden": s.hidden, "topk": s.topk, "M": M, "fitted": predicted.as_dict(),
                "fitted_from": fitted.label if fitted else "heuristic",
                "table": own.table[key].as_dict() if own else None,
                "table_from": f"{own.name}@M={key}" if own else None,
                "heuristic": heuristic(where, e.dtype, limits).as_dict(),
                "classic": classic_default(M, s.experts, get_dtype(e.dtype).fp8_scheme).as_dict(),
            })
    return out


def write_points(path: Path, pts: list[dict], device_name: str, tables: Sequence[Tuned]) -> None:
    """The points as a versioned JSON file a GPU run reads (``audit.fittime.read_points``), written whole."""
    from moebench.store.atomic import write_json_atomic

    write_json_atomic(Path(path), {"format": POINTS_FORMAT, "version": POINTS_VERSION, "device_name": device_name,
                                   "tables": sorted(t.name for t in tables), "points": pts})
