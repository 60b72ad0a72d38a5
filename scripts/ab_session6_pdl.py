"""A/B on a GPU of two launch-side changes, at each point's best config of the current benchmark run folders:
"pdl", the GEMMs and the activation launch launched as programmatic dependents (their programs start while
the previous launch ends, and wait for it before reading its output), and "pf", each GEMM program asking L2
for its whole weight share before its K loop; "both"; "off" is neither (the kernels of commit 4c3de9f).
Layer time (graph replay, median, L2 flushed), each variant checked against the float32 reference first,
timed twice interleaved with the others, keeping the faster median. First it prints how many
``griddepcontrol`` and ``prefetch.global.L2`` instructions the PTX of both GEMMs holds with "both".

    PYTHONPATH=$PWD python3 scripts/ab_session6_pdl.py > rows.jsonl

It ran (results/h200-session6/ab-pdl-prefetch.jsonl) on the kernels of commit 4c3de9f with two module
switches, ``PDL_LAUNCH`` and ``PREFETCH``, that commit e0f31fe replaced: programmatic dependent launch is
now tied to ``direct_route`` and the prefetch is gone, so this script no longer runs as it is.
"""

import json
import sys

from _points import best_rows, check_then_time, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.tile import TileConfig

RUNS = ["results/h200-kernels-fd59e5b", "results/h200-kernels-0c6f1ed/*/", "results/h200-kernels-cb3a072/*/",
        "results/h200-kernels-decode-walk/*/"]
best = best_rows(*RUNS)


class Switched:
    """The kernels module with the experiment switches set as given for every call."""

    def __init__(self, pdl: bool, prefetch: bool):
        self.pdl, self.prefetch = pdl, prefetch

    def fused_moe(self, *args, **kwargs):
        kernels.PDL_LAUNCH, kernels.PREFETCH = self.pdl, self.prefetch
        return kernels.fused_moe(*args, **kwargs)


VARIANTS = {"off": Switched(False, False), "pdl": Switched(True, False), "pf": Switched(False, True),
            "both": Switched(True, True)}


def measure(model: str, dtype: str, m: int) -> dict:
    problem, inp, ref, out = point_setup(model, dtype, m)
    cfg = TileConfig.from_dict(best[(model, dtype, m)]["config"])
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=best[(model, dtype, m)]["time_us"])
    return check_then_time(row, {k: (v, cfg) for k, v in VARIANTS.items()}, inp, out, ref, problem.spec.rtol)


points = [k for k in sorted(best) if k[2] <= 64] + [("deepseek-v3@tp8", "fp8-block128", 4096),
                                                     ("qwen3-30b-a3b", "fp8-block128", 1024),
                                                     ("mixtral-8x7b", "fp8-tensor", 1024)]
problem, inp, ref, out = point_setup(*points[0])
compiled: list = []
w = inp.weights
VARIANTS["both"].fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids,
                           TileConfig.from_dict(best[points[0]]["config"]), out=out, fp8_scheme=w.fp8_scheme,
                           w13_scale=w.w13_scale, w2_scale=w.w2_scale, compiled=compiled)
for k in compiled:
    ptx = k.asm["ptx"]
    print(getattr(k, "name", "kernel"), "griddepcontrol:", ptx.count("griddepcontrol"), "prefetch.global.L2:",
          ptx.count("prefetch.global.L2"), file=sys.stderr)
for point in points:
    print(json.dumps(measure(*point)), flush=True)
