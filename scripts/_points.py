"""What the A/B scripts share: each benchmark point's best triton row of a tuned run, and its problem.

A script run as ``python3 scripts/x.py`` finds this module next to it.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable
from glob import glob
from types import ModuleType

import torch

from moebench.models import get_model, shard
from moebench.paths.torch_ref import moe_reference
from moebench.problem import MoEInputs, Problem, make_inputs
from moebench.results import load_run
from moebench.roofline import Ceilings, measure_ceilings
from moebench.tile import TileConfig
from moebench.timing import time_graph

BENCHMARK_RUN = "results/h200-kernels-bab17e1/*"  # the tuned run whose best configs the A/Bs start from
# The tuned run folders (as globs) whose fastest row per point gives the config the later A/Bs and
# scripts/retime_best.py start from: those of session 13's report in docs/kernels.md (timed with the zero-fill
# flush), then the decode points tuned with the read flush at 5535446 (added after its best-configs run), the
# fp8-block128 decode points tuned again at 3e7870e with gemm2_preload among the candidates, the whole
# benchmark tuned again at 890f8be with tail tiles among them, the fp8-tensor points tuned again at 7f72fbb,
# whose GEMM1 gives h's per-tensor quantization its tile maxima, and the nine points of 16-64 slots per expert
# tuned again at b71c20a, whose tuner tries the tiles that hold a busy expert's slots in one row tile, and the
# three points of 64 slots per expert tuned again at 93dc62d, whose tuner tries tail tiles there.
REPORT_RUNS = tuple("results/h200-kernels-" + run for run in (
    "6be41bd", "6be41bd-ds4096", "1fd6e45/*-*", "1694d9e/*-*", "b7f19ac/*-*", "93e00f1/*-*", "d02c38f/*-*",
    "31c76a7/*-*", "0bd199d/*-*", "3869705/*-*", "2c1f5bd/*-*", "92ac413/*-*", "5535446/*-decode",
    "3e7870e/*-decode", "890f8be/deepseek-v3-tp8", "890f8be/qwen3-30b-a3b", "890f8be/mixtral-8x7b",
    "890f8be/tail-first/*", "7f72fbb/*-*", "b71c20a/*-*", "93dc62d/*-*"))


def best_rows(*run_globs: str) -> dict[tuple[str, str, int], dict]:
    """(model, dtype, M) -> the fastest correct triton row over the run folders matching ``run_globs``
    (BENCHMARK_RUN if none is given)."""
    best: dict[tuple[str, str, int], dict] = {}
    for folder in sorted({f for g in run_globs or (BENCHMARK_RUN,) for f in glob(g)}):
        _, df = load_run(folder)
        ok = df[(df["path"] == "triton") & (df["status"] == "ok") & (df["correct"] == True)]  # noqa: E712
        for r in ok.to_dict("records"):
            key = (r["model"], r["dtype"], int(r["M"]))
            if key not in best or r["time_us"] < best[key]["time_us"]:
                best[key] = r
    return best


def m_range(args: list[str]) -> tuple[int, int]:
    """The [MIN_M [MAX_M]] arguments of an A/B script, 1 and unbounded when left out."""
    lo, hi = (int(a) for a in args + ["1", "1000000"][len(args):])
    return lo, hi


def prefill_first(best: dict[tuple[str, str, int], dict], lo: int = 1, hi: int = 1_000_000):
    """For each point of ``best`` with lo <= M <= hi, the largest M first: (its best config, problem, fresh
    inputs, float32 reference, output buffer, and a result row naming the point, config and benchmark time)."""
    for (model, dtype, m), r in sorted(best.items(), key=lambda kv: (-kv[0][2], kv[0][0], kv[0][1])):
        if not lo <= m <= hi:
            continue
        cfg = TileConfig.from_dict(r["config"])
        problem, inp, ref, out = point_setup(model, dtype, m)
        row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=round(r["time_us"], 1))
        yield cfg, problem, inp, ref, out, row


def problem_of(model: str, dtype: str, m: int) -> Problem:
    """The problem of a point named as in the rows: ``deepseek-v3@tp8`` is the preset at TP8."""
    name, _, tp = model.partition("@tp")
    return Problem(shard(get_model(name), tp=int(tp or 1)), m, dtype)


def point_setup(model: str, dtype: str, m: int, device: str = "cuda"):
    """A point's problem, fresh inputs, its float32 reference output and an output buffer [M, hidden]."""
    problem = problem_of(model, dtype, m)
    inp = make_inputs(problem, device)
    ref = moe_reference(inp.x, inp.weights, inp.topk_weights, inp.topk_ids).float()
    out = torch.empty(m, problem.shape.hidden, device=device, dtype=problem.spec.act)
    return problem, inp, ref, out


def layer(kernels, inp: MoEInputs, cfg: TileConfig, out: torch.Tensor) -> Callable[[], None]:
    """The layer as a call of ``kernels.fused_moe`` (a module: the working tree's or an older copy)."""
    w = inp.weights

    def run() -> None:
        kernels.fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, cfg, out=out,
                          fp8_scheme=w.fp8_scheme, w13_scale=w.w13_scale, w2_scale=w.w2_scale)
    return run


def checked_error(run: Callable[[], None], out: torch.Tensor, ref: torch.Tensor, *poisoned: torch.Tensor) -> float:
    """Relative error of one run against the reference, with the output (and ``poisoned``) set to NaN first."""
    for t in (out, *poisoned):
        t.fill_(float("nan"))
    run()
    return ((out.float() - ref).norm() / ref.norm()).item()


def module_from_file(path: str, name: str) -> ModuleType:
    """The Python file at ``path`` (a copy of a kernel file) loaded as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scratch_module(name: str) -> ModuleType:
    """An older copy of a kernel file, ``.scratch/{name}.py`` (made by ``git show``), as a module."""
    return module_from_file(f".scratch/{name}.py", name)


def check_then_time(row: dict, variants: dict, inp: MoEInputs, out: torch.Tensor, ref: torch.Tensor,
                    rtol: float, rounds: int = 2, alternate: bool = False) -> dict:
    """Each variant (label -> (kernels module, config)) checked against ``ref``, its error kept in
    ``row[label + "_err"]`` (or, where it cannot run, e.g. out of shared memory, "label: error type" added to
    ``row["failed"]``); those within ``rtol`` timed ``rounds`` times, interleaved with the others, keeping the
    fastest median in ``row[label]`` (a variant timed first read up to 8% slow in an earlier run). ``alternate``:
    every other round in reverse order, so no variant is always timed after the others (the compute-bound
    prefill points ran up to 8% slower as a run went on, session 17)."""
    fns = {}
    for label, (kernels, cfg) in variants.items():
        fn = layer(kernels, inp, cfg, out)
        try:
            err = checked_error(fn, out, ref)  # compiles it, or raises
        except Exception as e:  # noqa: BLE001 - a variant that cannot run is a result, not the end of the script
            row.setdefault("failed", []).append(f"{label}: {type(e).__name__}")
            continue
        row[f"{label}_err"] = round(err, 5)
        if err < rtol:
            fns[label] = fn
    for r in range(rounds):
        for label, fn in (reversed(fns.items()) if alternate and r % 2 else fns.items()):
            t = round(time_graph(fn, budget_s=0.3).median_us, 1)
            row[label] = min(t, row.get(label, t))
    return row


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def measure_best_points(path: str, measure: Callable[[str, str, int, TileConfig, Ceilings], dict],
                        printed: tuple[str, ...]) -> list[dict]:
    """Every point of ``REPORT_RUNS`` measured at its best config by ``measure(model, dtype, m, config,
    ceilings)``, the ceilings measured first: the JSON Lines file ``path`` gets a line of the ceilings, then each
    row as it finishes, whose ``point`` and ``printed`` fields are printed. Returns the rows."""
    ceilings = measure_ceilings()
    rows = []
    with open(path, "w") as f:
        f.write(json.dumps(dict(ceilings=ceilings.as_dict())) + "\n")
        for (model, dtype, m), best in sorted(best_rows(*REPORT_RUNS).items()):
            row = measure(model, dtype, m, TileConfig.from_dict(best["config"]), ceilings)
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            print(row["point"], *(row.get(k) for k in printed), flush=True)
            torch.cuda.empty_cache()
    return rows


def append_summary(path: str, summary: dict) -> None:
    """The summary line after a run's rows in ``path``, and printed."""
    with open(path, "a") as f:
        f.write(json.dumps(dict(summary=summary)) + "\n")
    print(json.dumps(dict(summary=summary), indent=1))
