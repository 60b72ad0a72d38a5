"""One layer of a benchmark point at its best config of the given run folders, run once after a warm-up
call, for a kernel profiler (Nsight Compute) to read the hardware counters of its GEMMs.

    ncu --clock-control none -k regex:_gemm -s 2 -c 2 --section SpeedOfLight ... \\
        python3 scripts/ncu_point.py deepseek-v3@tp8 fp8-block128 4096 'results/h200-kernels-cb3a072/*/'
"""

import sys

import torch
from _points import best_rows, layer, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.tile import TileConfig

model, dtype, m = sys.argv[1], sys.argv[2], int(sys.argv[3])
best = best_rows(*sys.argv[4:])
cfg = TileConfig.from_dict(best[(model, dtype, m)]["config"])
print(f"{model} {dtype} M={m} config {cfg.as_dict()}")
_, inp, ref, out = point_setup(model, dtype, m)
run = layer(kernels, inp, cfg, out)
run()  # compile and warm up (skipped by ncu's -s)
run()
torch.cuda.synchronize()
