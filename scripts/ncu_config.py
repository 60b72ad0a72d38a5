"""One layer of a benchmark point at a tile config given as JSON, run after a warm-up call, for a kernel
profiler (Nsight Compute) to read the hardware counters of its GEMMs; prints the config and the relative
error against the float32 reference.

    ncu --clock-control none -k regex:^_gemm -s 2 -c 2 --metrics ... \\
        python3 scripts/ncu_config.py qwen3-30b-a3b fp8-block128 4096 '{"BLOCK_SIZE_M": 64, ...}'
"""

import json
import sys

import torch
from _points import layer, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.tile import TileConfig

model, dtype, m, cfg = sys.argv[1], sys.argv[2], int(sys.argv[3]), TileConfig.from_dict(json.loads(sys.argv[4]))
_, inp, ref, out = point_setup(model, dtype, m)
run = layer(kernels, inp, cfg, out)
run()  # compile and warm up (skipped by ncu's -s)
run()
torch.cuda.synchronize()
err = ((out.float() - ref).norm() / ref.norm()).item()
print(f"CFG {model} {dtype} {m} {cfg.as_dict()} err {err:.2e}", flush=True)
