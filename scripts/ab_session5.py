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

import json
import sys
from dataclasses import replace

from _points import best_rows, check_then_time, point_setup, scratch_module

import moebench.kernels.fused_moe as new
from moebench.tile import TileConfig

SAME = sys.argv[1:] == ["same"]
base = scratch_module("fused_moe_base")
mid = None if SAME else scratch_module("fused_moe_mid")

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

    variants = {"base": (base, cfg), "new": (new, cfg)}
    if not SAME:
        variants = {"base": (base, cfg), "mid": (mid, cfg), "new": (new, cfg)}
        if (model, dtype, m) not in DECODE:
            variants.update({f"t{n}": (new, replace(cfg, gemm2_n_tiles=n)) for n in (2, 4, 8)})
        elif not cfg.atomic_sum:
            variants["atomic"] = (new, replace(cfg, atomic_sum=True))
    return check_then_time(row, variants, inp, out, ref, problem.spec.rtol)


for point in DECODE + PREFILL:
    if not (SAME and point[0] == DS and point[2] >= 64):
        print(json.dumps(measure(*point)), flush=True)
