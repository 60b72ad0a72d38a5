"""What the A/B scripts share: each benchmark point's best triton row of a tuned run, and its problem.

A script run as ``python3 scripts/x.py`` finds this module next to it.
"""

from __future__ import annotations

from glob import glob

from moebench.models import get_model, shard
from moebench.problem import Problem
from moebench.results import load_run

BENCHMARK_RUN = "results/h200-kernels-bab17e1/*"  # the tuned run whose best configs the A/Bs start from


def best_rows(run_glob: str = BENCHMARK_RUN) -> dict[tuple[str, str, int], dict]:
    """(model, dtype, M) -> the fastest correct triton row over the run folders matching ``run_glob``."""
    best: dict[tuple[str, str, int], dict] = {}
    for folder in sorted(glob(run_glob)):
        _, df = load_run(folder)
        ok = df[(df["path"] == "triton") & (df["status"] == "ok") & (df["correct"] == True)]  # noqa: E712
        for r in ok.to_dict("records"):
            key = (r["model"], r["dtype"], int(r["M"]))
            if key not in best or r["time_us"] < best[key]["time_us"]:
                best[key] = r
    return best


def problem_of(model: str, dtype: str, m: int) -> Problem:
    """The problem of a point named as in the rows: ``deepseek-v3@tp8`` is the preset at TP8."""
    name, _, tp = model.partition("@tp")
    return Problem(shard(get_model(name), tp=int(tp or 1)), m, dtype)
