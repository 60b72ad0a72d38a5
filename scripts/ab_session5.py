"""A/B on a GPU, layer time (graph replay, median, L2 flushed) at each point's best config of
results/h200-kernels-fd59e5b (and -0c6f1ed), each variant checked against the float32 reference first.

Kernel files compared (``.scratch/``, made as below):
- "base": commit 12a1e7b, before this session;
- "mid": the kernels with GEMM1 zeroing GEMM2's sums, split-K partials stored (summed by the activation
  launch in one load of all splits) and, with the atomic top-k sum at M <= 64, GEMM2's last program per
  column tile casting the sums into the output;
- "new": the working tree: "mid" with GEMM2's loop over column tiles x K steps (``gemm2_n_tiles``);
  "new" itself runs one column tile per program, as "mid" does.

Variants: the kernels above at the same config; "atomic": new with the atomic top-k sum where the best
config stored rows (decode points); "t2"/"t4"/"t8": new with GEMM2 walking 2/4/8 column tiles per program
(prefill points). Each variant is timed twice, interleaved with the others, and keeps the faster median.

    git show 12a1e7b:moebench/kernels/fused_moe.py > .scratch/fused_moe_base.py
    # .scratch/fused_moe_mid.py: the working tree's kernel file before gemm2_n_tiles
    PYTHONPATH=$PWD python3 scripts/ab_session5.py > rows.jsonl

``same`` as the first argument times only base and new at every point but DeepSeek-V3's prefill ones
(no mid file needed): where the tuner tries no walk, the two should launch the same loop.
"""

import importlib.util
import json
import sys
from dataclasses import replace

from _points import best_rows, checked_error, layer, point_setup

import moebench.kernels.fused_moe as new
from moebench.tile import TileConfig
from moebench.timing import time_graph


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, f".scratch/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SAME = sys.argv[1:] == ["same"]
base = _load("fused_moe_base")
mid = None if SAME else _load("fused_moe_mid")

DS, QWEN, MIX = "deepseek-v3@tp8", "qwen3-30b-a3b", "mixtral-8x7b"
DECODE = [(DS, "fp8-block128", 1), (DS, "fp8-block128", 4), (QWEN, "fp8-block128", 1), (QWEN, "bf16", 1),
          (QWEN, "bf16", 4), (MIX, "fp8-tensor", 1)]
PREFILL = [(DS, "fp8-block128", m) for m in (64, 256, 1024, 4096)]
PREFILL += [(QWEN, "fp8-block128", m) for m in (64, 256, 1024, 4096)]
PREFILL += [(QWEN, "bf16", m) for m in (1024, 4096)] + [(MIX, "fp8-tensor", 1024)]

best = best_rows("results/h200-kernels-fd59e5b")
best.update({k: v for k, v in best_rows("results/h200-kernels-0c6f1ed/*/").items()
             if k not in best or v["time_us"] < best[k]["time_us"]})


def measure(model: str, dtype: str, m: int) -> dict:
    problem, inp, ref, out = point_setup(model, dtype, m)
    cfg = TileConfig.from_dict(best[(model, dtype, m)]["config"])
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), bench_us=best[(model, dtype, m)]["time_us"])

    variants = {"base": (base, cfg), "new": (new, cfg)} if SAME else {
        "base": (base, cfg), "mid": (mid, cfg), "new": (new, cfg)}
    if SAME:
        pass
    elif (model, dtype, m) in DECODE:
        if not cfg.atomic_sum:
            variants["atomic"] = (new, replace(cfg, atomic_sum=True))
    else:
        for n in (2, 4, 8):
            variants[f"t{n}"] = (new, replace(cfg, gemm2_n_tiles=n))

    fns = {}
    for label, (mod, c) in variants.items():
        fn = layer(mod, inp, c, out)
        err = checked_error(fn, out, ref)
        row[f"{label}_err"] = round(err, 5)
        if err < problem.spec.rtol:
            fns[label] = fn
    # Each variant twice, interleaved: a variant timed first read up to 8% slow in an earlier run.
    for _ in range(2):
        for label, fn in fns.items():
            t = round(time_graph(fn, budget_s=0.3).median_us, 1)
            row[label] = min(t, row.get(label, t))
    return row


for point in DECODE + PREFILL:
    if not (SAME and point[0] == DS and point[2] >= 64):
        print(json.dumps(measure(*point)), flush=True)
