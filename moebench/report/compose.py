"""A step's time from its parts' rows (``moebench step``): each part's time times how many of it the model runs
(its row's ``count``, ``step.counts``), summed; the modelled all-reduces kept in their own column.

    step_us      = attention x layers + (router + moe + shared) x MoE layers + dense_mlp x dense layers + head
    prefill: ttft_ms = (step_us + allreduce_us) / 1000 for ``batch`` prompts of ``length`` tokens
    decode:  tpot_ms = (step_us + allreduce_us) / 1000, tok_s = batch / tpot

Each path's MoE time replaces the others' in the same sum (the other parts are measured once per point), so
``layer_vs`` (the baseline path's MoE time over this path's) and ``e2e_vs`` (the baseline's step over this
path's) say what a faster layer buys end to end. Plain arithmetic over row dicts: no torch.
"""

from __future__ import annotations

from collections import defaultdict

TTFT_COLUMNS = ["model", "dtype", "path", "batch", "prompt", "moe_ms", "step_ms", "allreduce_ms", "ttft_ms",
                "moe_pct", "layer_vs", "e2e_vs", "missing"]
DECODE_COLUMNS = ["model", "dtype", "path", "batch", "context", "moe_ms", "step_ms", "allreduce_ms", "tpot_ms",
                  "tok_s", "moe_pct", "layer_vs", "e2e_vs", "missing"]
STACK_COLUMNS = ["model", "dtype", "path", "phase", "batch", "length", "stack_layers", "stack_us", "parts_us",
                 "stack_vs_parts"]




def _key(r: dict) -> tuple:
    return r["model"], r["dtype"], r["phase"], r["batch"], r["length"]


def _ok(r: dict) -> bool:
    return r.get("status") == "ok" and r.get("time_us") is not None


def compose(rows: list[dict], vs: str | None = None) -> list[dict]:
    """One composed step per (model, dtype, phase, batch, length, path) of the MoE rows: its MoE, measured and
    all-reduce times (us), the parts it lacks (``missing``: a part that failed, was refused or is absent leaves the
    step without a time), and against the ``vs`` path's step at the same point."""
    shared: dict[tuple, dict[str, dict]] = defaultdict(dict)
    moe: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r["part"] == "moe":
            moe[_key(r)][r["path"]] = r
        elif r["part"] != "stack":
            shared[_key(r)][r["part"]] = r
    steps = []
    for key, by_path in moe.items():
        parts = shared[key]
        for path, m in by_path.items():
            need = [r for r in (*parts.values(), m) if r["count"]]
            missing = sorted(r["part"] for r in need if not _ok(r))
            done = not missing
            measured = sum(r["count"] * r["time_us"] for r in need if r["measured"]) if done else None
            comm = sum(r["count"] * r["time_us"] for r in need if not r["measured"]) if done else None
            moe_us = m["count"] * m["time_us"] if _ok(m) else None
            steps.append({"model": key[0], "dtype": key[1], "phase": key[2], "batch": key[3], "length": key[4],
                          "path": path, "moe_us": moe_us, "step_us": measured, "allreduce_us": comm,
                          "missing": ",".join(missing) or None})
    if vs is not None:
        base = {(s["model"], s["dtype"], s["phase"], s["batch"], s["length"]): s for s in steps if s["path"] == vs}
        for s in steps:
            b = base.get((s["model"], s["dtype"], s["phase"], s["batch"], s["length"]))
            s["layer_vs"] = _ratio(b and b["moe_us"], s["moe_us"])
            s["e2e_vs"] = _ratio(b and total_us(b), total_us(s))
    return steps


def _ratio(base: float | None, this: float | None) -> float | None:
    """base / this (> 1: this is faster), or None where either is missing."""
    return base / this if base is not None and this else None


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000


def total_us(s: dict) -> float | None:
    """A step's measured time with its modelled all-reduces; None where a part is missing."""
    return None if s["step_us"] is None else s["step_us"] + s["allreduce_us"]


def _record(s: dict, length: str, total: str, **extra) -> dict:
    """One table record of step ``s``: its length under ``length``, its total time (ms) under ``total``."""
    return {"model": s["model"], "dtype": s["dtype"], "path": s["path"], "batch": s["batch"], length: s["length"],
            "moe_ms": _ms(s["moe_us"]), "step_ms": _ms(s["step_us"]), "allreduce_ms": _ms(s["allreduce_us"]),
            total: _ms(total_us(s)), **extra, "moe_pct": _pct(s), "layer_vs": s.get("layer_vs"),
            "e2e_vs": s.get("e2e_vs"), "missing": s["missing"]}


def ttft_records(steps: list[dict]) -> list[dict]:
    """The TTFT table's records: the prefill steps, in ms."""
    return [_record(s, "prompt", "ttft_ms") for s in steps if s["phase"] == "prefill"]


def decode_records(steps: list[dict]) -> list[dict]:
    """The decode table's records: per-token latency (ms) and tokens/s of the batch."""
    return [_record(s, "context", "tpot_ms", tok_s=None if not (t := total_us(s)) else s["batch"] / (t * 1e-6))
            for s in steps if s["phase"] == "decode"]


def _pct(s: dict) -> float | None:
    """The MoE layers' share of the measured step (all-reduces left out), in %."""
    return None if s["step_us"] is None or s["moe_us"] is None else 100.0 * s["moe_us"] / s["step_us"]


def stack_parts_us(rows: list[dict], point_key: tuple, path: str, layers: int) -> float | None:
    """The sum of the parts a stack of ``layers`` MoE layers runs, each timed alone at the same point:
    layers x (attention + router + moe + shared); None where one lacks a time."""
    at = [r for r in rows if _key(r) == point_key and r["part"] in ("attention", "router", "moe", "shared")
          and (r["part"] != "moe" or r["path"] == path)]
    if not any(r["part"] == "moe" for r in at) or not all(_ok(r) for r in at):
        return None
    return layers * sum(r["time_us"] for r in at if r["count"])


def stack_records(rows: list[dict]) -> list[dict]:
    """The composition check's records: each stack's time beside the sum of its parts."""
    out = []
    for r in rows:
        if r["part"] != "stack":
            continue
        ratio = _ratio(r["time_us"], r["parts_us"]) if r["time_us"] is not None else None
        out.append({"model": r["model"], "dtype": r["dtype"], "path": r["path"], "phase": r["phase"],
                    "batch": r["batch"], "length": r["length"], "stack_layers": r["stack_layers"],
                    "stack_us": r["time_us"], "parts_us": r["parts_us"], "stack_vs_parts": ratio})
    return out
