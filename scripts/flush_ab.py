"""Does the timer's L2 flush cost the timed code? A/B of three ways to empty L2 before each replay.

``moebench.timing`` zeroes a buffer 4x the L2 before each replay: L2 is then full of dirty lines, which the
timed kernels' reads must evict, writing them back to HBM while they read. Variants, each before every replay:
- ``zero``: the timer's flush as it is;
- ``zero_read``: the same, then a read of another buffer as large (L2 left holding clean lines);
- ``read``: only the read.
Timed: one-launch reads of the decode GEMMs' weight bytes (``scripts/decode_read.py``'s fastest kernels of
its H200 run) and the layer at the benchmark's best configs (``_points.REPORT_RUNS``) of the wide models'
M=1 points and a few larger ones, each layer checked against the float32 reference first. Each variant is
timed by ``moebench.timing.time_graph`` with its flush, 60 replays (the committed rows were made by this
script's form of commit 5535446, which copied the timer's loop, 60 replays too).

    PYTHONPATH=$PWD python3 scripts/flush_ab.py > $OUT/flush-ab.jsonl
"""

import json
from functools import partial as partial_fn

import decode_read
import torch
from _points import REPORT_RUNS, best_rows, checked_error, layer, point_setup

import moebench.kernels.fused_moe as kernels
from moebench.kernels.stream import _read_rows, read_all
from moebench.tile import TileConfig
from moebench.timing import L2Flush, time_graph

POINTS = [("deepseek-v3@tp8", "fp8-block128", 1), ("qwen3-30b-a3b", "fp8-block128", 1), ("qwen3-30b-a3b", "bf16", 1),
          ("deepseek-v3@tp8", "fp8-block128", 4), ("qwen3-30b-a3b", "fp8-block128", 4), ("mixtral-8x7b", "bf16", 1),
          ("qwen3-30b-a3b", "bf16", 64), ("qwen3-30b-a3b", "fp8-block128", 4096)]
READS = [r for r in decode_read.READS if r[0] in ("deepseek-v3@tp8 fp8 gemm1", "deepseek-v3@tp8 fp8 both",
                                                 "qwen3 bf16 gemm1")]


def flushes():
    """name -> a callable that empties L2 as that variant does (two ``L2Flush`` buffers of 4x the L2)."""
    props = torch.cuda.get_device_properties(0)
    n, programs = max(256 << 20, 4 * props.L2_cache_size), 8 * props.multi_processor_count
    zero, read = (L2Flush(n, programs, "cuda", mode) for mode in ("zero", "read"))
    return {"zero": zero, "zero_read": lambda: (zero(), read()), "read": read}


def ab(label: str, fn, fl: dict, extra: dict) -> None:
    row = dict(timed=label, **extra)
    for _ in range(2):  # interleaved twice, the faster median kept
        for name, flush in fl.items():
            t = round(time_graph(fn, min_reps=60, max_reps=60, flush=flush).median_us, 2)
            row[name] = min(t, row.get(name, t))
    print(json.dumps(row), flush=True)


def main() -> None:
    fl = flushes()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for label, rows, row_bytes in READS:
        w = torch.randn(rows, row_bytes // 2, device="cuda", dtype=torch.bfloat16, generator=gen)
        out = torch.empty(rows, device="cuda", dtype=torch.float32)
        partial = torch.empty(132 * 8, device="cuda", dtype=torch.float32)
        mb = round(w.numel() * 2 / 1e6, 1)
        by_rows = partial_fn(_read_rows[(rows // 32,)], w, out, w.shape[1], BLOCK_R=32, BLOCK_C=256, num_warps=4,
                             num_stages=4)
        ab(f"{label} read_rows r32 c256 s4", by_rows, fl, dict(mbytes=mb))
        flat = partial_fn(read_all, w.view(-1), partial, block=2048, num_warps=8)
        ab(f"{label} read_all p8 b2048 w8", flat, fl, dict(mbytes=mb))
    best = best_rows(*REPORT_RUNS)
    for model, dtype, m in POINTS:
        r = best[(model, dtype, m)]
        cfg = TileConfig.from_dict(r["config"])
        problem, inp, ref, out = point_setup(model, dtype, m)
        fn = layer(kernels, inp, cfg, out)
        err = checked_error(fn, out, ref)
        if not err < problem.spec.rtol:
            print(json.dumps(dict(timed=f"{model} {dtype} M={m}", error=err)), flush=True)
            continue
        ab(f"{model} {dtype} M={m}", fn, fl, dict(bench_us=round(r["time_us"], 1), err=round(err, 5)))


if __name__ == "__main__":
    main()
