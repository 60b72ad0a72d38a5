"""What GEMM2's top-k sum costs at the prefill points under 60% of floor: the layer at its best config
("base"), with GEMM2's atomic additions predicated off ("no_sum": every add masked, so no output traffic; a
wrong output, timed as a bound only), and with the stored rows and the sum launch ("stored"); and which
atomic instructions the base GEMM2's PTX holds.

    PYTHONPATH=$PWD python3 scripts/gemm2_sum_bound.py > rows.jsonl
"""

import json
import re
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

from _points import REPORT_RUNS, best_rows, checked_error, layer, module_from_file, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.timing import time_graph

POINTS = [("deepseek-v3@tp8", "fp8-block128", 4096), ("qwen3-30b-a3b", "fp8-block128", 4096),
          ("qwen3-30b-a3b", "fp8-block128", 1024), ("deepseek-v3@tp8", "fp8-block128", 1024),
          ("qwen3-30b-a3b", "bf16", 4096)]


def no_sum_module():
    """fused_moe.py with GEMM2's atomic add masked everywhere (N < 0 is never true, and not known at compile)."""
    src = Path(kernels.__file__).read_text()
    old = 'acc.to(out_ptr.dtype.element_ty), mask=mask,\n                      sem="relaxed")'
    assert src.count(old) == 1
    path = Path(tempfile.mkdtemp()) / "fused_moe_no_sum.py"
    path.write_text(src.replace(old, 'acc.to(out_ptr.dtype.element_ty), mask=mask & (N < 0),\n'
                                     '                      sem="relaxed")'))
    return module_from_file(str(path), "fused_moe_no_sum")


def atomic_ops(ptx: str) -> dict:
    return dict(Counter(m.group(1) for m in re.finditer(r"^\s*(?:@%p\d+\s+)?((?:red|atom)\.[\w.]+)", ptx, re.M)))


def main() -> None:
    best = best_rows(*REPORT_RUNS)
    nosum = no_sum_module()
    for model, dtype, m in POINTS:
        r = best[(model, dtype, m)]
        cfg = kernels.TileConfig.from_dict(r["config"])
        problem, inp, ref, out = point_setup(model, dtype, m)
        row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=round(r["time_us"], 1))
        compiled = []
        w = inp.weights
        kernels.fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, cfg, out=out, fp8_scheme=w.fp8_scheme,
                          w13_scale=w.w13_scale, w2_scale=w.w2_scale, compiled=compiled)
        row["gemm2_atomics"] = atomic_ops(compiled[1].asm["ptx"])
        variants = {"base": (kernels, cfg), "no_sum": (nosum, cfg),
                    "stored": (kernels, replace(cfg, atomic_sum=False, atomic_out=False, gemm2_split_k=1))}
        fns = {}
        for label, (mod, c) in variants.items():
            fn = layer(mod, inp, c, out)
            row[f"{label}_err"] = round(checked_error(fn, out, ref), 5)
            fns[label] = fn
        for _ in range(2):
            for label, fn in fns.items():
                t = round(time_graph(fn, budget_s=0.3).median_us, 1)
                row[label] = min(t, row.get(label, t))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
