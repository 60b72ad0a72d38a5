"""GPU time of GEMM2 alone (``moebench.profile.kernel_breakdown``) at the fp8-block128 and bf16 prefill points,
at each point's best config and at taller or wider GEMM2 tiles: does GEMM2 want other tiles than GEMM1?

GEMM2 shares BLOCK_SIZE_M (the align step), num_warps and num_stages with GEMM1, so each variant changes the
whole config; only the GEMM2 kernel's time is read from it (and GEMM1's, for the record).

    PYTHONPATH=$PWD python3 scripts/gemm2_height.py [--tails] > $OUT/gemm2-height.jsonl
"""

import json
import sys
from dataclasses import replace

from _points import REPORT_RUNS, best_rows, problem_of

from moebench.profile import kernel_breakdown
from moebench.tile import TileConfig

POINTS = [("deepseek-v3@tp8", "fp8-block128", 4096), ("qwen3-30b-a3b", "fp8-block128", 4096),
          ("deepseek-v3@tp8", "fp8-block128", 1024), ("qwen3-30b-a3b", "fp8-block128", 1024),
          ("qwen3-30b-a3b", "bf16", 4096)]
# (label, fields changed from the best config)
VARIANTS = [
    ("best", {}),
    ("m128-w8-n128", dict(BLOCK_SIZE_M=128, num_warps=8, gemm2_block_n=128, tail_tiles=0)),
    ("m128-w8-n256", dict(BLOCK_SIZE_M=128, num_warps=8, gemm2_block_n=256, tail_tiles=0)),
    ("m128-w8-n128-s3", dict(BLOCK_SIZE_M=128, num_warps=8, gemm2_block_n=128, num_stages=3, tail_tiles=0)),
    ("m64-w8-n256", dict(BLOCK_SIZE_M=64, num_warps=8, gemm2_block_n=256, tail_tiles=0)),
    ("m64-w4-n128-s2", dict(BLOCK_SIZE_M=64, num_warps=4, gemm2_block_n=128, num_stages=2, tail_tiles=0)),
]
# With --tails: 128-row tiles whose experts' last tiles run at 64 (or 32) rows where their slots fit.
TAIL_VARIANTS = [
    ("best", {}),
    ("m128-w8-n128-t1", dict(BLOCK_SIZE_M=128, num_warps=8, gemm2_block_n=128, tail_tiles=1)),
    ("m128-w8-n128-t2", dict(BLOCK_SIZE_M=128, num_warps=8, gemm2_block_n=128, tail_tiles=2)),
    ("m128-w8-n128-s3-t1", dict(BLOCK_SIZE_M=128, num_warps=8, gemm2_block_n=128, num_stages=3, tail_tiles=1)),
    ("m128-w4-n128-t1", dict(BLOCK_SIZE_M=128, num_warps=4, gemm2_block_n=128, num_stages=3, tail_tiles=1)),
    ("m128-w8-n64-t1", dict(BLOCK_SIZE_M=128, num_warps=8, gemm2_block_n=64, tail_tiles=1)),
]


def main() -> None:
    best = best_rows(*REPORT_RUNS)
    variants = TAIL_VARIANTS if "--tails" in sys.argv else VARIANTS
    for model, dtype, m in POINTS:
        row = best[(model, dtype, m)]
        cfg0 = TileConfig.from_dict(row["config"])
        for label, change in variants:
            if dtype == "bf16" and label != "best" and change.get("gemm2_block_n") == 128:
                continue
            cfg = replace(cfg0, **change)
            out = dict(point=f"{model} {dtype} M={m}", variant=label, config=cfg.as_dict(), bench_us=row["time_us"])
            try:
                rows = kernel_breakdown(problem_of(model, dtype, m), "triton", cfg, reps=10)
            except Exception as e:  # noqa: BLE001 - out of shared memory etc. is a result
                out["failed"] = f"{type(e).__name__}: {str(e)[:120]}"
            else:
                for r in rows:
                    name = ("gemm1" if "gemm1" in r["kernel"] else "gemm2" if "gemm2" in r["kernel"]
                            else "total" if r["kernel"] == "total" else r["kernel"][:24])
                    out[name] = round(out.get(name, 0) + r["us"], 1)
            print(json.dumps(out), flush=True)
            print(out["point"], label, out.get("gemm1"), out.get("gemm2"), out.get("total"), out.get("failed", ""),
                  file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
