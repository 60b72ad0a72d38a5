"""What the A/B scripts share: each benchmark point's best triton row of a tuned run, and its problem.

A script run as ``python3 scripts/x.py`` finds this module next to it.
"""

from __future__ import annotations

from collections.abc import Callable
from glob import glob

import torch

from moebench.models import get_model, shard
from moebench.paths.torch_ref import moe_reference
from moebench.problem import MoEInputs, Problem, make_inputs
from moebench.results import load_run
from moebench.tile import TileConfig

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


def checked_error(run: Callable[[], None], out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error of one run against the reference, with the output poisoned first."""
    out.fill_(float("nan"))
    run()
    return ((out.float() - ref).norm() / ref.norm()).item()
