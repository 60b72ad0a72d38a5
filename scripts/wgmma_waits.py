"""On a GPU: how the compiled GEMMs wait for their wgmma groups (PTX ``wgmma.wait_group N``), at each prefill
point's best config (M >= 1024) of the benchmark runs. ``wait_group 0`` waits for every MMA in flight, so
one that follows each MMA means the K loop never overlaps an MMA with what comes after it; ``wait_group 1``
lets one group run on while the next step is issued.

    PYTHONPATH=$PWD python3 scripts/wgmma_waits.py > waits.jsonl
"""

import json
import re
from collections import Counter

from _points import best_rows, point_setup

from moebench.kernels.fused_moe import fused_moe
from moebench.tile import TileConfig

best = best_rows("results/h200-kernels-6be41bd", "results/h200-kernels-6be41bd-ds4096",
                 "results/h200-kernels-1fd6e45/*-*", "results/h200-kernels-b7f19ac/*-*")
for (model, dtype, m), r in sorted(best.items()):
    if m < 1024:
        continue
    cfg = TileConfig.from_dict(r["config"])
    problem, inp, _, out = point_setup(model, dtype, m)
    w = inp.weights
    kernels: list = []
    fused_moe(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, cfg, out=out, fp8_scheme=w.fp8_scheme,
              w13_scale=w.w13_scale, w2_scale=w.w2_scale, compiled=kernels)
    for name, k in zip(("gemm1", "gemm2"), kernels):
        ptx = k.asm["ptx"]
        waits = Counter(re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx))
        print(json.dumps(dict(point=f"{model} {dtype} M={m}", kernel=name, config=cfg.as_dict(),
                              wgmma=ptx.count("wgmma.mma_async"), commits=ptx.count("wgmma.commit_group"),
                              waits={f"wait_group {n}": c for n, c in sorted(waits.items())})), flush=True)
