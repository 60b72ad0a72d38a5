"""A/B on a GPU: the GEMMs' K loops unrolled by two (``tl.range(..., loop_unroll_factor=2)``), fewer loop
iterations per K, against the working tree's kernels.

The unrolled kernels are the working tree's ``moebench/kernels/fused_moe.py`` with its four K loops (GEMM1's
two forms, GEMM2's one-tile and column-walking loops) written as ``tl.range(..., loop_unroll_factor=2)``, loaded
from a temporary copy. Each benchmark point of the given dtypes and M range runs at its best config
(``_points.REPORT_RUNS``) with the working tree's kernels ("head"), the unrolled ones ("unroll"), and the working
tree's once more ("head_again": how far two timings of one kernel land apart); each checked against the float32
reference first (``*_err``), then timed twice interleaved, the second round in reverse order (CUDA-graph replay,
L2 flushed, median us), the fastest kept; a variant that cannot run is named in ``failed``.

    PYTHONPATH=$PWD python3 scripts/ab_unroll.py MIN_M MAX_M DTYPE[,DTYPE...] > rows.jsonl
"""

import json
import sys
import tempfile
from pathlib import Path

from _points import REPORT_RUNS, best_rows, check_then_time, m_range, module_from_file, prefill_first

import moebench.kernels.fused_moe as kernels

LOOPS = {"for k in range(k_first, k_last):": "for k in tl.range(k_first, k_last, loop_unroll_factor=2):",
         "for t in range(0, N_TILES * k_steps):": "for t in tl.range(0, N_TILES * k_steps, loop_unroll_factor=2):"}


def unrolled_kernels():
    """The working tree's kernel module with its K loops unrolled by two, loaded from a temporary file."""
    src = Path(kernels.__file__).read_text()
    for old, new in LOOPS.items():
        src = src.replace(old, new)
    assert src.count("loop_unroll_factor=2") == 4, "the kernel file's K loops are not the four this script knows"
    path = Path(tempfile.mkdtemp()) / "fused_moe_unroll.py"  # Triton reads a kernel's source from its file
    path.write_text(src)
    return module_from_file(str(path), "fused_moe_unroll")


lo, hi = m_range(sys.argv[1:3])
dtypes = sys.argv[3].split(",")
unroll = unrolled_kernels()
best = {key: row for key, row in best_rows(*REPORT_RUNS).items() if key[1] in dtypes}
for cfg, problem, inp, ref, out, row in prefill_first(best, lo, hi):
    variants = {"head": (kernels, cfg), "unroll": (unroll, cfg), "head_again": (kernels, cfg)}
    row = check_then_time(row, variants, inp, out, ref, problem.spec.rtol, rounds=2, alternate=True)
    row["gain"] = round(row["head"] / row["unroll"], 3) if "unroll" in row and "head" in row else None
    print(json.dumps(row), flush=True)
