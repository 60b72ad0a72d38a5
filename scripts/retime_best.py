"""Time every point of sweeps/h200-kernels.yaml once more, each triton point at its best config of the runs
the report of docs/kernels.md reads (``_points.REPORT_RUNS``), cutlass as it is: a run folder like a sweep's,
with its own ceilings, untuned (0.3 s of timing per row), every row checked against the float32 reference.

``--flush`` picks how the timer empties L2 before each replay (``moebench.timing.FLUSH``): "read", the timer's
way since session 14, or "zero", the fill every run before it used, to compare the two on the same machine.

    MOEBENCH_GIT_COMMIT=<commit> PYTHONPATH=$PWD python3 scripts/retime_best.py $OUT/read --flush read
"""

import argparse
from dataclasses import replace
from pathlib import Path

from _points import REPORT_RUNS, best_rows

from moebench import timing
from moebench.runner import run_sweep
from moebench.spec import load_spec
from moebench.tile import TileConfig


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path, help="where the run folder is made")
    p.add_argument("--flush", choices=("read", "zero"), default="read")
    args = p.parse_args()
    timing.FLUSH = args.flush
    spec = replace(load_spec("sweeps/h200-kernels.yaml"), tune=False)
    configs = {key: TileConfig.from_dict(row["config"]) for key, row in best_rows(*REPORT_RUNS).items()}
    print(run_sweep(spec, args.out, configs=configs, on_row=lambda r: print(
        r["model"], r["dtype"], r["M"], r["path"], r["status"], r["time_us"], r["pct_of_floor"], flush=True)))


if __name__ == "__main__":
    main()
