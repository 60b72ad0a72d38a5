"""How fast can one launch read the weights of a decode GEMM? A bound for the wide models' M=1 points.

At M=1 each GEMM reads the weights of the 8 experts routed to (tens of MB) in one short launch. This times
streaming-read kernels over the same bytes, L2 flushed, CUDA-graph replay, and keeps the fastest of each:
- ``read_rows``: moebench's read through ``tl.dot`` (a 16-row tile of ones times each weight tile, as a decode
  GEMM with Swap-AB does), over a matrix of the GEMM's bytes as 16-bit rows of its row length, at several
  tile heights, widths and stage counts;
- ``read_all``: a flat sum, a few programs per SM, several block sizes and warps;
- ``torch``: ``x @ w.T`` with x one bf16 row (cuBLAS's GEMV) over the same bytes as bf16.

The bytes are the GEMMs' weights at DeepSeek-V3@tp8 fp8-block128, Qwen3 fp8-block128 and Qwen3 bf16 M=1
(8 experts each; fp8 rows read as bf16 rows of half the elements), and both GEMMs' together. The read
ceiling of ``moebench.roofline`` (a 4 GiB read) is measured in the same run.

    PYTHONPATH=$PWD python3 scripts/decode_read.py > $OUT/decode-read.jsonl
"""

import json
from itertools import product

import torch

from moebench.kernels.stream import _read_rows, read_all
from moebench.roofline import measure_ceilings
from moebench.timing import time_graph
from moebench.tuning import SMS

# (label, rows, row bytes): the 8 routed experts' weights of one GEMM.
READS = [
    ("deepseek-v3@tp8 fp8 gemm1", 8 * 512, 7168),
    ("deepseek-v3@tp8 fp8 gemm2", 8 * 7168, 256),
    ("deepseek-v3@tp8 fp8 both", 8 * 512 + 8 * 256, 7168),  # GEMM2's 8 x 7168 x 256 bytes as 7168-byte rows
    ("qwen3 fp8 gemm1", 8 * 1536, 2048),
    ("qwen3 fp8 gemm2", 8 * 2048, 768),
    ("qwen3 bf16 gemm1", 8 * 1536, 4096),
    ("qwen3 bf16 gemm2", 8 * 2048, 1536),
]


def readers(w: torch.Tensor):
    """(name, callable) of each read of w [R, C] bf16."""
    R, C = w.shape
    out = torch.empty(R, device=w.device, dtype=torch.float32)
    for block_r, block_c, stages in product((16, 32, 64, 128), (64, 128, 256, 512), (3, 4, 6)):
        if R % block_r or C % block_c or block_r * block_c * 2 * stages > 200 << 10:
            continue
        yield (f"read_rows r{block_r} c{block_c} s{stages}",
               lambda br=block_r, bc=block_c, s=stages: _read_rows[(R // br,)](
                   w, out, C, BLOCK_R=br, BLOCK_C=bc, num_warps=4, num_stages=s))
    flat = w.view(-1)
    for per_sm, block, warps in product((1, 2, 4, 8, 16), (2048, 4096, 8192), (4, 8)):
        partial = torch.empty(SMS * per_sm, device=w.device, dtype=torch.float32)
        yield (f"read_all p{per_sm} b{block} w{warps}",
               lambda p=partial, b=block, wp=warps: read_all(flat, p, block=b, num_warps=wp))
    x = torch.randn(1, C, device=w.device, dtype=torch.bfloat16)
    y = torch.empty(1, R, device=w.device, dtype=torch.bfloat16)
    yield "torch gemv", lambda: torch.matmul(x, w.T, out=y)


def main() -> None:
    ceil = measure_ceilings()
    print(json.dumps(dict(ceilings=ceil.as_dict())), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for label, rows, row_bytes in READS:
        w = torch.randn(rows, row_bytes // 2, device="cuda", dtype=torch.bfloat16, generator=gen)
        nbytes = w.numel() * 2
        best = {}
        for name, fn in readers(w):
            t = time_graph(fn, budget_s=0.05, min_reps=20, max_reps=60).median_us
            kind = name.split()[0]
            if kind not in best or t < best[kind][1]:
                best[kind] = (name, t)
        row = dict(read=label, mbytes=round(nbytes / 1e6, 1),
                   floor_us=round(nbytes / (ceil.read_gbps * 1e3), 2))
        for kind, (name, t) in best.items():
            row[kind] = dict(best=name, us=round(t, 2), tbps=round(nbytes / t / 1e6, 2))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
