"""Each point's bound: how near its floor a layer could come on this machine.

A point's floor is its bytes over the read rate of a stream of gigabytes, or its
FLOPs over the rate of an 8192^3 GEMM; neither is the work of a point, which
reads tens of MB in one short launch or multiplies a few hundred rows per expert.
Its bound is the slower of two measured times, both kinder to the layer than
its work allows:

- ``read_us``: one launch that only reads the floor's bytes (the touched
  experts' weights and scales plus the activations), contiguous;
- ``gemm_us``: cuBLAS's two dense GEMMs of the layer's shapes over all
  ``M * topk`` rows, contiguous and unrouted: no gather, no padding, no
  activation, no top-k sum.

This module holds the arithmetic (which rows are the points, the bound and its
ratios, the dense GEMMs' shapes, FLOPs and bytes, the summary), pure and tested
on the CPU; ``bounds_measure`` times the two bounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from moebench.dtypes import get_dtype
from moebench.errors import UserError
from moebench.models import MoEShape
from moebench.problem import Problem
from moebench.store.runfolder import load_run, schema_warning

# A point: one shape, dtype, token count and routing (a different routing touches other experts, other bytes).
POINT_KEY = ["model", "experts", "hidden", "intermediate", "topk", "dtype", "M", "routing"]

# The columns of a bounds table, in order (csv/json output rely on them).
BOUND_COLUMNS = [
    "model", "dtype", "M", "topk", "routing", "layer_us", "read_us", "gemm_us", "bound_us", "bound_by",
    "floor_us", "floor_bound", "layer_pct", "read_pct", "gemm_pct", "bound_pct", "layer_of_bound",
    "reader", "gemm_err", "run", "error",
]
# What a person reads in the table; the rest is in csv and json.
TABLE_COLUMNS = [
    "model", "dtype", "M", "layer_us", "read_us", "gemm_us", "bound_us", "bound_by", "bound_pct", "layer_pct",
    "layer_of_bound",
]
RATIOS = ("layer_pct", "read_pct", "gemm_pct", "bound_pct", "layer_of_bound")
UNDER_PCT = 60.0  # a bound below this share of its floor is named in the summary


def choose_points(df: pd.DataFrame, path: str = "triton", where: str = "the rows") -> pd.DataFrame:
    """The fastest correct, timed row of ``path`` per point (as ``report --gains`` picks a tuned run's best
    config), sorted by model, dtype and M. Raises UserError, naming ``where``, if there is none."""
    ok = df[(df["path"] == path) & (df["status"] == "ok") & (df["correct"] == True)  # noqa: E712 - object column
            & df["time_us"].notna() & df["experts_touched"].notna()]
    if ok.empty:
        paths = sorted({str(p) for p in df.loc[df["status"] == "ok", "path"].dropna()})
        there = f"; paths with ok rows there: {', '.join(paths)}" if paths else ""
        raise UserError(f"no correct, timed rows of path {path!r} in {where}{there}")
    best = ok.sort_values("time_us", kind="stable").drop_duplicates(POINT_KEY, keep="first")
    return best.sort_values(["model", "dtype", "M", "topk", "routing"], kind="stable").reset_index(drop=True)


def load_points(runs: Sequence[Path | str], path: str = "triton") -> tuple[pd.DataFrame, list[str]]:
    """The points of the run folders ``runs`` taken together (``choose_points``), each row with its folder in
    ``run``, and the warnings to show (schema versions, a torn last row). Refuses interpreter runs and folders
    that are not runs."""
    frames, warnings = [], []
    for run in runs:
        meta, df = load_run(run)
        if w := schema_warning(meta, str(run)):
            warnings.append(w)
        warnings += df.attrs.get("warnings", [])  # a last row cut short, left out
        refuse_interpreter_run(run, meta, df)
        if "global_experts" in df.columns and df["global_experts"].notna().any():
            raise UserError(f"{run} has rows run through an expert_map (sweep --ep-map): bounds takes layers whose "
                            "ids are local (its dense GEMMs and floor would count other ranks' slots)")
        frames.append(df.assign(run=str(run)))
    return choose_points(pd.concat(frames, ignore_index=True), path, ", ".join(map(str, runs))), warnings


def refuse_interpreter_run(run: Path | str, meta: dict, df: pd.DataFrame) -> None:
    """A run from the Triton interpreter (CPU) has no GPU layer times to set beside a bound: UserError."""
    flags = df["interpreter"].map(lambda v: v is True or v == 1) if "interpreter" in df.columns else []
    if meta.get("interpreter") is True or any(flags):
        raise UserError(f"{run} is an interpreter (CPU) run: its layer times are not GPU times to set beside a bound")


def problem_of(point: dict) -> Problem:
    """The problem a result row names, its shape taken from the row's own columns."""
    shape = MoEShape(str(point["model"]), int(point["experts"]), int(point["hidden"]), int(point["intermediate"]),
                     int(point["topk"]), int(point.get("moe_layers") or 1))
    return Problem(shape, int(point["M"]), str(point["dtype"]), str(point.get("routing") or "uniform"),
                   int(point.get("seed") or 0))


def label(point: dict) -> str:
    """How the summary names a point: ``mixtral-8x7b bf16 M=16`` (and its routing where not uniform)."""
    text = f"{point['model']} {point['dtype']} M={point['M']}"
    return text if point.get("routing", "uniform") == "uniform" else f"{text} {point['routing']}"


@dataclass(frozen=True)
class GemmShape:
    """One dense product ``[rows, k] @ [k, n]``: the activations times one expert's weights, transposed."""

    rows: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.n * self.k


def dense_gemm_shapes(problem: Problem) -> tuple[GemmShape, GemmShape]:
    """The layer's two GEMMs as dense products over all ``M * topk`` rows: x [T, K] by w13 [2I, K] and
    h [T, I] by w2 [K, I]. At fp8 the rows are padded to a multiple of 16, as ``torch._scaled_mm`` needs."""
    s = problem.shape
    rows = problem.M * s.topk
    if problem.spec.is_fp8:
        rows = -(-rows // 16) * 16
    return GemmShape(rows, 2 * s.intermediate, s.hidden), GemmShape(rows, s.hidden, s.intermediate)


def dense_gemm_flops(shapes: Iterable[GemmShape]) -> int:
    """FLOPs of the dense GEMMs: the point's own ``2 * M * topk * 3 * I * K`` where no rows were rounded up."""
    return sum(g.flops for g in shapes)


def dense_gemm_bytes(shapes: Iterable[GemmShape], dtype: str) -> int:
    """Bytes the dense GEMMs move at least: each operand read once (activations and one expert's weights in the
    dtype's storage) and each output written once in the activation dtype."""
    d = get_dtype(dtype)
    return sum((g.rows * g.k + g.n * g.k) * d.weight_bytes + g.rows * g.n * d.act_bytes for g in shapes)


def bound_fields(layer_us: float, floor_us: float, read_us: float, gemm_us: float) -> dict:
    """The bound (the slower of the two times), which binds, each time as % of floor, and ``layer_of_bound``:
    the share of its bound the layer reaches (bound / layer time; 1.0 is the layer at its bound)."""
    bound_us = max(read_us, gemm_us)
    fields = dict(read_us=read_us, gemm_us=gemm_us, bound_us=bound_us,
                  bound_by="read" if read_us >= gemm_us else "gemm")
    for name, us in (("layer", layer_us), ("read", read_us), ("gemm", gemm_us), ("bound", bound_us)):
        fields[f"{name}_pct"] = 100.0 * floor_us / us
    fields["layer_of_bound"] = bound_us / layer_us
    return fields


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summarize(rows: Sequence[dict]) -> dict:
    """Geometric means over the points whose bound was measured, each with its lowest point; the points not
    measured; the points whose bound is under ``UNDER_PCT`` % of their floor."""
    done = [r for r in rows if r.get("bound_pct") is not None]
    summary: dict = dict(points=len(done), not_measured=[label(r) for r in rows if r.get("bound_pct") is None])
    for name in RATIOS:
        if done:
            low = min(done, key=lambda r: r[name])
            summary[name] = dict(geomean=geomean([r[name] for r in done]), lowest=low[name], lowest_at=label(low))
    summary["bound_under_60"] = [label(r) for r in done if r["bound_pct"] < UNDER_PCT]
    return summary


def summary_line(summary: dict) -> str:
    """The summary in one line, for people."""
    if not summary["points"]:
        return f"no bound measured ({len(summary['not_measured'])} point(s) failed)"

    def pct(name: str) -> str:
        s = summary[name]
        return f"{s['geomean']:.1f}% (lowest {s['lowest']:.1f}%, {s['lowest_at']})"

    lob = summary["layer_of_bound"]
    text = (f"{summary['points']} points, geometric means: bound {pct('bound_pct')} of floor, "
            f"layer {pct('layer_pct')}, layer at {lob['geomean']:.3f} of its bound "
            f"(lowest {lob['lowest']:.3f}, {lob['lowest_at']}); "
            f"bound under {UNDER_PCT:.0f}% of floor: {', '.join(summary['bound_under_60']) or 'none'}")
    if summary["not_measured"]:
        text += f"; not measured: {', '.join(summary['not_measured'])}"
    return text


def mixing_warnings(points: pd.DataFrame, device: str, method: str) -> list[str]:
    """What makes a layer time a poor match for bounds measured on ``device`` with ``method``: rows measured on
    another GPU, or timed another way."""
    warnings = []
    others = sorted({str(d) for d in points["device_name"].dropna()} - {device})
    if others:
        warnings.append(f"layer times measured on {', '.join(others)}, bounds on {device}: ratios mix machines")
    methods = sorted({str(m) for m in points["timing_method"].dropna()} - {method})
    if methods:
        warnings.append(f"layer times taken by {'; '.join(methods)}, bounds by {method}")
    return warnings


def bounds_table(rows: Sequence[dict]) -> pd.DataFrame:
    """The rows as a DataFrame of ``BOUND_COLUMNS`` (absent values as None)."""
    return pd.DataFrame([{c: r.get(c) for c in BOUND_COLUMNS} for r in rows], columns=BOUND_COLUMNS)


def ceilings_line(ceilings: dict) -> str:
    """The run's ceilings in one line: what every % of floor is measured against."""
    return (f"ceilings of this run: read {ceilings['read_gbps'] / 1e3:.2f} TB/s, "
            f"copy {ceilings['copy_gbps'] / 1e3:.2f} TB/s, bf16 {ceilings['bf16_tflops']:.0f} TFLOP/s, "
            f"fp8 {ceilings['fp8_tflops']:.0f} TFLOP/s")
