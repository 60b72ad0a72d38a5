"""GPU time per kernel (``moebench.profile.kernel_breakdown``) of every point under 60% of floor, at its
best config, in the tuned run folders named by the arguments (a glob each).

    PYTHONPATH=$PWD python3 scripts/profile_low_points.py 'results/h200-kernels-X/*' > profile.txt
"""

import json
import sys

from _points import best_rows, problem_of

from moebench.profile import kernel_breakdown
from moebench.tile import TileConfig

best = best_rows(*sys.argv[1:])
print(f"# moebench profile (PyTorch profiler, eager, L2 flushed; GPU time per kernel per layer, us) of the best "
      f"config of each point under 60% of floor in {' '.join(sys.argv[1:])}")
for (model, dtype, m), row in sorted(best.items()):
    if row["pct_of_floor"] >= 60:
        continue
    print(f"== {model} {dtype} M={m}: graph {row['time_us']:.1f} us, floor {row['floor_us']:.1f} us, "
          f"config {json.dumps(row['config'])}")
    print("kernel,calls,us")
    for r in kernel_breakdown(problem_of(model, dtype, m), "triton", TileConfig.from_dict(row["config"])):
        print(f"\"{r['kernel']}\",{r['calls']:.0f},{r['us']:.1f}", flush=True)
