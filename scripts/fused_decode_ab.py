"""The layer in one launch at decode (``scripts/fused_decode.py``) against the layer at its best config.

At each decode point below: the layer at its fastest config over ``_points.REPORT_RUNS``, then the one-launch
layer at every tile of a small grid, each checked against the float32 reference (output poisoned first),
timed only if correct and checked again after its timed replays (the sync buffer left zero); a one-launch
streaming read of the point's bytes (``read_all``) as the bound a one-launch layer can approach; floor and
ceilings measured in the same run. One JSON row per point to stdout, a table last on stderr: the layer and
the fastest one-launch tile of each form (GEMM1 on the CUDA cores, or by tl.dot), in us and % of floor.

    PYTHONPATH=$PWD python3 scripts/fused_decode_ab.py > $OUT/fused-decode.jsonl
"""

from __future__ import annotations

import json
import sys
from itertools import product

import torch
import triton
from _points import REPORT_RUNS, best_rows, checked_error, layer, point_setup
from fused_decode import fused_decode

from moebench.kernels import fused_moe
from moebench.kernels.stream import read_all
from moebench.roofline import floor, measure_ceilings
from moebench.tile import TileConfig
from moebench.timing import time_graph
from moebench.tuning import SMS

POINTS = [("deepseek-v3@tp8", "fp8-block128", 1), ("qwen3-30b-a3b", "fp8-block128", 1),
          ("qwen3-30b-a3b", "bf16", 1), ("deepseek-v3@tp8", "fp8-block128", 4),
          ("qwen3-30b-a3b", "fp8-block128", 4), ("qwen3-30b-a3b", "bf16", 4)]

# (block_i, block_k, block_n, warps) of the fastest CUDA-core tiles at the three shapes over a wider grid in an
# earlier run (results/h200-session30/fused-decode-cores-grid.jsonl).
CUDA_CORE_TILES = ((8, 512, 32, 8), (32, 256, 8, 8), (32, 256, 4, 8))


def tiles(H: int, I: int, topk: int, wbytes: int, block128: bool):
    """(block_i, block_k, block_n, warps, dot, stages) to try: the CUDA-core tiles, then GEMM1 by tl.dot over a
    grid, each dividing the shape with GEMM2's weights within 256 bytes (64 registers) a thread."""
    i_pad = triton.next_power_of_2(I)
    for bi, bk, bn, warps in CUDA_CORE_TILES:
        if not (I % bi or H % bk or H % bn):
            yield bi, bk, bn, warps, False, 1
    for bi, bk, bn, warps, stages in product((32, 64), (128,) if block128 else (128, 256), (4, 8, 16, 32), (4, 8),
                                             (3, 4, 5)):
        if I % bi or H % bk or topk * bn * i_pad * wbytes > 256 * 32 * warps:
            continue
        yield bi, bk, bn, warps, True, stages


def bare_read_us(nbytes: int) -> float:
    """The fastest one-launch flat read of ``nbytes`` over a few grid and block sizes."""
    flat = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    best = float("inf")
    for per_sm, block in product((2, 4, 8), (4096, 8192)):
        partial = torch.empty(SMS * per_sm, device="cuda", dtype=torch.float32)
        best = min(best, time_graph(lambda p=partial, b=block: read_all(flat, p, block=b, num_warps=8),
                                    budget_s=0.05, min_reps=20, max_reps=60).median_us)
    return best


def fused_layer(inp, out: torch.Tensor, bi: int, bk: int, bn: int, warps: int, dot: bool, stages: int):
    """The layer as one call of ``fused_decode`` at one tile."""
    w = inp.weights

    def run() -> None:
        fused_decode(inp.x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, out, w.fp8_scheme, w.w13_scale,
                     w.w2_scale, block_i=bi, block_k=bk, block_n=bn, num_warps=warps, dot=dot, num_stages=stages)
    return run


def main() -> None:
    ceil = measure_ceilings()
    print(json.dumps(dict(ceilings=ceil.as_dict())), flush=True)
    best = best_rows(*REPORT_RUNS)
    table = []
    for model, dtype, m in POINTS:
        problem, inp, ref, out = point_setup(model, dtype, m)
        fl = floor(problem, inp.experts_touched, ceil)
        row = dict(point=f"{model} {dtype} M={m}", floor_us=round(fl.floor_us, 2), mbytes=round(fl.bytes / 1e6, 1))
        cfg = TileConfig.from_dict(best[(model, dtype, m)]["config"])
        fn = layer(fused_moe, inp, cfg, out)
        row["layer_err"] = round(checked_error(fn, out, ref), 5)
        row["layer_us"] = round(time_graph(fn, budget_s=0.3).median_us, 2)
        row["read_us"] = round(bare_read_us(fl.bytes), 2)
        H, I = problem.shape.hidden, problem.shape.intermediate
        fused = []
        for bi, bk, bn, warps, dot, stages in tiles(H, I, problem.shape.topk, problem.spec.weight_bytes,
                                                    dtype == "fp8-block128"):
            run = fused_layer(inp, out, bi, bk, bn, warps, dot, stages)
            tile = f"i{bi} k{bk} n{bn} w{warps}" + (f" dot s{stages}" if dot else "")
            try:
                err = checked_error(run, out, ref)
            except triton.runtime.errors.OutOfResources:
                fused.append(dict(tile=tile, failed="out of resources"))
                continue
            if err > problem.spec.rtol:
                fused.append(dict(tile=tile, err=round(err, 5), failed="wrong"))
                continue
            t = time_graph(run, budget_s=0.05, min_reps=20, max_reps=60).median_us
            again = checked_error(run, out, ref)  # after the timed replays: the sync buffer was left zero
            fused.append(dict(tile=tile, err=round(err, 5), us=round(t, 2), err_after=round(again, 5)))
        timed = sorted((f for f in fused if "us" in f), key=lambda f: f["us"])
        row["fused"] = timed + [f for f in fused if "us" not in f]
        print(json.dumps(row), flush=True)
        forms = [min((f for f in timed if (" dot " in f["tile"]) == dot), key=lambda f: f["us"], default=None)
                 for dot in (False, True)]
        table.append((row, forms))
    head = "".join(f" {name:>7} {'%fl':>5}" for name in ("layer", "cores", "dot"))
    print(f"{'point':<34} {'floor':>6} {'read':>6}{head}", file=sys.stderr)
    for row, forms in table:
        cells = "".join(f" {f['us']:7.1f} {100 * row['floor_us'] / f['us']:5.1f}" if f else f" {'-':>7} {'-':>5}"
                        for f in forms)
        print(f"{row['point']:<34} {row['floor_us']:6.1f} {row['read_us']:6.1f} {row['layer_us']:7.1f} "
              f"{100 * row['floor_us'] / row['layer_us']:5.1f}{cells}", file=sys.stderr)


if __name__ == "__main__":
    main()
