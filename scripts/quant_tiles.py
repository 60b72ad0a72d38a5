"""x's 1x128-group quantization (``act_quant._quantize_groups``, here with the zeroing of the top-k sums beside
it) at other tile shapes and program orders, on a GPU: is the launch, which takes 9.8 us at Qwen3 fp8-block128
M=1024 for 10 MB (1.1 TB/s), held by its tiles?

Variants: rows per program (``BLOCK_R``), 128-wide groups per program (``GROUPS``), warps, and which way the
programs walk (rows fastest, as ``_quantize_groups``'s grid, or groups fastest). Each checked bit for bit
against ``quantize_act`` (the fp8 values and the scales, and the sums all zero), then timed (CUDA-graph replay,
L2 flushed, median us) beside ``quantize_act`` with and without the zeroing, and the zeroing launch alone.

    PYTHONPATH=$PWD python3 scripts/quant_tiles.py > rows.jsonl
"""

import itertools
import json

import torch
import triton
import triton.language as tl

from moebench.kernels.act_quant import GROUP, quantize_act, quantize_groups_of
from moebench.timing import time_graph


@triton.jit
def _groups_tile(x_ptr, q_ptr, scale_ptr, zero_ptr, R, K, stride_x, stride_q, stride_s, stride_z,
                 BLOCK_R: tl.constexpr, GROUPS: tl.constexpr, GROUPS_FASTEST: tl.constexpr):
    """One program: BLOCK_R rows x GROUPS groups of 128 columns of x in fp8, and the same tile of the sums
    zeroed."""
    n_row_blocks = tl.cdiv(R, BLOCK_R)
    n_col_blocks = tl.cdiv(tl.cdiv(K, 128), GROUPS)
    pid = tl.program_id(0)
    if GROUPS_FASTEST:
        rb, cb = pid // n_col_blocks, pid % n_col_blocks
    else:
        rb, cb = pid % n_row_blocks, pid // n_row_blocks
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    r64 = rows.to(tl.int64)
    for i in tl.static_range(GROUPS):
        g = cb * GROUPS + i
        cols = g * 128 + tl.arange(0, 128)
        ok = row_ok[:, None] & (cols < K)[None, :]
        v = tl.load(x_ptr + r64[:, None] * stride_x + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        q, scale = quantize_groups_of(v, 1, q_ptr.dtype.element_ty, False)
        tl.store(q_ptr + r64[:, None] * stride_q + cols[None, :], q, mask=ok)
        tl.store(scale_ptr + r64 * stride_s + g, scale, mask=row_ok & (g * 128 < K))
        tl.store(zero_ptr + r64[:, None] * stride_z + cols[None, :], tl.zeros_like(v).to(zero_ptr.dtype.element_ty),
                 mask=ok)


def measure(R: int, K: int) -> dict:
    """The row of one shape of x [R, K]."""
    gen = torch.Generator(device="cuda").manual_seed(R + K)
    x = torch.randn(R, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    sums = torch.empty(R, K, device="cuda", dtype=torch.bfloat16)
    want_q, want_s = quantize_act(x, "block128")
    row = dict(shape=[R, K], mbytes=round(5 * x.numel() / 1e6, 1))  # x read, q and the sums written
    row["launch_and_zero"] = round(time_graph(lambda: (quantize_act(x, "block128"), sums.zero_())).median_us, 2)
    row["launch_zeroing"] = round(time_graph(lambda: quantize_act(x, "block128", zero=sums)).median_us, 2)
    row["zero_alone"] = round(time_graph(lambda: sums.zero_()).median_us, 2)
    q = torch.empty_like(want_q)
    s = torch.empty_like(want_s)
    variants = {}
    for block_r, groups, warps, fastest in itertools.product((8, 16, 32, 64), (1, 2, 4), (2, 4, 8), (False, True)):
        if block_r * groups * 128 > 32768:
            continue
        grid = (triton.cdiv(R, block_r) * triton.cdiv(triton.cdiv(K, GROUP), groups),)

        def fn(b=block_r, g=groups, w=warps, f=fastest, grid=grid):
            _groups_tile[grid](x, q, s, sums, R, K, x.stride(0), q.stride(0), s.stride(0), sums.stride(0),
                               BLOCK_R=b, GROUPS=g, GROUPS_FASTEST=f, num_warps=w)
        sums.fill_(float("nan"))
        q.zero_()
        fn()
        same = (torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)
                and bool((sums == 0).all()))
        label = f"r{block_r}_g{groups}_w{warps}_{'gfirst' if fastest else 'rfirst'}"
        variants[label] = round(time_graph(fn).median_us, 2) if same else "wrong"
    timed = {k: v for k, v in variants.items() if v != "wrong"}
    row["wrong"] = [k for k, v in variants.items() if v == "wrong"]
    row["fastest"] = sorted(timed.items(), key=lambda kv: kv[1])[:6]
    row["variants"] = variants
    return row


for R, K in [(1024, 2048), (4096, 2048), (256, 7168), (1024, 7168), (4096, 7168)]:  # Qwen3's x, DeepSeek-V3@tp8's
    print(json.dumps(measure(R, K)), flush=True)
