"""SM clock and board power while the timer runs: the roofline's bf16 and fp8 GEMMs (as
``roofline.measure_ceilings`` times them) and the long compute-bound layers of the benchmark, each at its best
config (``_points.REPORT_RUNS``), sampled by ``nvidia-smi`` every 20 ms. Each is timed twice: once with the
sweep's budget (0.3 s of replays) and once for 3 s, to see whether a sustained layer runs at the clock the
ceilings were measured at.

    PYTHONPATH=$PWD python3 scripts/clocks.py > rows.jsonl
"""

import json
import statistics
import subprocess
import threading
import time

from _points import REPORT_RUNS, best_rows, layer, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.roofline import ceiling_matmuls
from moebench.tile import TileConfig
from moebench.timing import time_graph

POINTS = [("mixtral-8x7b", "bf16", 4096), ("mixtral-8x7b", "bf16", 1024), ("mixtral-8x7b", "fp8-tensor", 1024),
          ("qwen3-30b-a3b", "bf16", 4096), ("qwen3-30b-a3b", "fp8-block128", 4096)]


def sampler(samples: list) -> subprocess.Popen:
    """nvidia-smi printing the SM clock and board power every 20 ms; a thread appends (host time, MHz, W)."""
    proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                             "-lms", "20"], stdout=subprocess.PIPE, text=True, bufsize=1)

    def read() -> None:
        for line in proc.stdout:
            try:
                mhz, watts = (float(v) for v in line.split(","))
            except ValueError:
                continue
            samples.append((time.time(), mhz, watts))
    threading.Thread(target=read, daemon=True).start()
    return proc


def main() -> None:
    size = 8192
    bf16_mm, fp8_mm = ceiling_matmuls(size)
    cases = [("ceiling bf16 8192^3", 2 * size**3, bf16_mm), ("ceiling fp8 8192^3", 2 * size**3, fp8_mm)]
    best = best_rows(*REPORT_RUNS)
    for model, dtype, m in POINTS:
        _, inp, _, out = point_setup(model, dtype, m)
        cfg = TileConfig.from_dict(best[(model, dtype, m)]["config"])
        cases.append((f"{model} {dtype} M={m}", None, layer(kernels, inp, cfg, out)))
    samples = []  # (host time, MHz, W)
    proc = sampler(samples)
    marks = []
    for label, flops, fn in cases:
        for budget, max_reps in ((0.3, 200), (3.0, 100000)):
            time_graph(fn, budget_s=0.05, min_reps=3, max_reps=5)  # compile, capture once
            time.sleep(1.0)  # let the clock settle between cases
            t0 = time.time()
            t = time_graph(fn, budget_s=budget, max_reps=max_reps)
            marks.append((label, budget, flops, t.median_us, t0, time.time()))
    time.sleep(0.2)
    proc.terminate()
    for label, budget, flops, us, t0, t1 in marks:
        inside = [(mhz, w) for ts, mhz, w in samples if t0 <= ts <= t1]
        row = dict(case=label, budget_s=budget, median_us=round(us, 1), samples=len(inside),
                   sm_mhz=statistics.median(mhz for mhz, _ in inside) if inside else None,
                   min_sm_mhz=min((mhz for mhz, _ in inside), default=None),
                   watts=statistics.median(w for _, w in inside) if inside else None)
        if flops:
            row["tflops"] = round(flops / us / 1e6, 1)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
