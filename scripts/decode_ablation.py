"""Upper bounds of fusing the small decode launches away, on a GPU: each tile-per-slot decode point at its best
config, timed with the full layer and with each small launch skipped (the activation quantization of x, done
once ahead instead; the split-K activation; the top-k sum), then all three skipped. A skipped launch leaves
the output wrong, so only the full layer is checked against the float32 reference: the other times say how
much a fused form could gain at most, not what it gains. CUDA-graph replay, L2 flushed, median us, twice
interleaved.

    PYTHONPATH=$PWD python3 scripts/decode_ablation.py > rows.jsonl                 # session 9's best configs
    PYTHONPATH=$PWD python3 scripts/decode_ablation.py --report-runs > rows.jsonl   # those of REPORT_RUNS
"""

import json
import sys

from _points import REPORT_RUNS, best_rows, checked_error, layer, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.tile import TileConfig
from moebench.timing import time_graph


class _Skip:
    """Stands in for a Triton kernel: launching it does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


real = {name: getattr(kernels, name) for name in ("quantize_act", "_swiglu", "_topk_sum")}


def variant(skip: set, inp) -> None:
    """Patch the kernels module so the launches named in ``skip`` do not run."""
    for name, fn in real.items():
        setattr(kernels, name, fn)
    if "_swiglu" in skip:
        kernels._swiglu = _Skip()
    if "_topk_sum" in skip:
        kernels._topk_sum = _Skip()
    if "quantize_act" in skip and inp.weights.fp8_scheme:
        ahead = real["quantize_act"](inp.x, inp.weights.fp8_scheme)  # GEMM1's input, before the timed region

        def quantize_x_ahead(x, scheme, static=None, **kwargs):
            return ahead if x is inp.x else real["quantize_act"](x, scheme, static, **kwargs)
        kernels.quantize_act = quantize_x_ahead


VARIANTS = {"full": set(), "no_xquant": {"quantize_act"}, "no_swiglu": {"_swiglu"}, "no_sum": {"_topk_sum"},
            "none": {"quantize_act", "_swiglu", "_topk_sum"}}
SESSION9_RUNS = ("results/h200-kernels-6be41bd", "results/h200-kernels-1fd6e45/*-*")
best = best_rows(*(REPORT_RUNS if "--report-runs" in sys.argv else SESSION9_RUNS))
for (model, dtype, m), r in sorted(best.items()):
    cfg = TileConfig.from_dict(r["config"])
    if not cfg.direct_route:
        continue
    problem, inp, ref, out = point_setup(model, dtype, m)
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=round(r["time_us"], 1),
               bench_floor_us=round(r["floor_us"], 2))
    variant(set(), inp)
    row["full_err"] = round(checked_error(layer(kernels, inp, cfg, out), out, ref), 5)
    for _ in range(2):
        for label, skip in VARIANTS.items():
            variant(skip, inp)
            t = round(time_graph(layer(kernels, inp, cfg, out), budget_s=0.3).median_us, 1)
            row[label] = min(t, row.get(label, t))
    variant(set(), inp)
    print(json.dumps(row), flush=True)
