"""One layer of a benchmark point, run once after a warm-up call, for a kernel profiler (Nsight Compute) to
read the hardware counters of its GEMMs. The config is the point's best of the given run folders, or a
tile config given as JSON; it is printed with the layer's relative error against the float32 reference.

    ncu --clock-control none -k regex:^_gemm -s 2 -c 2 --section SpeedOfLight ... \\
        python3 scripts/ncu_point.py deepseek-v3@tp8 fp8-block128 4096 'results/h200-kernels-cb3a072/*/'
    ncu ... python3 scripts/ncu_point.py qwen3-30b-a3b fp8-block128 4096 '{"BLOCK_SIZE_M": 64, ...}'
"""

import json
import sys

import torch
from _points import best_rows, layer, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.tile import TileConfig

model, dtype, m = sys.argv[1], sys.argv[2], int(sys.argv[3])
if sys.argv[4].lstrip().startswith("{"):
    cfg = TileConfig.from_dict(json.loads(sys.argv[4]))
else:
    cfg = TileConfig.from_dict(best_rows(*sys.argv[4:])[(model, dtype, m)]["config"])
_, inp, ref, out = point_setup(model, dtype, m)
run = layer(kernels, inp, cfg, out)
run()  # compile and warm up (skipped by ncu's -s)
run()
torch.cuda.synchronize()
err = ((out.float() - ref).norm() / ref.norm()).item()
print(f"{model} {dtype} M={m} config {cfg.as_dict()} err {err:.2e}", flush=True)
