"""Ceilings measured in each GPU run, and the roofline floor of a problem.

The floor is the larger of (bytes the layer must move) / (memory bandwidth)
and FLOPs / (dense matmul rate of its dtype). Ceilings are measured, never
hard-coded: copy bandwidth counts bytes read plus bytes written, read
bandwidth the bytes a full reduction reads; the memory ceiling is the larger
of the two (an MoE layer mostly reads weights, and streaming reads run faster
than a copy). The matmul rates come from 8192^3 products on random data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from moebench.hardware import DeviceLimits
from moebench.kernels.stream import read_all, read_rows
from moebench.measure.timer import time_eager, time_graph
from moebench.problem import Problem


@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float  # device-to-device copy, (read + write) bytes / s / 1e9
    read_gbps: float  # a sum over a large tensor: bytes read / s / 1e9
    bf16_tflops: float  # dense bf16 matmul
    fp8_tflops: float  # dense fp8 e4m3 matmul (torch._scaled_mm), 0 where unsupported

    def as_dict(self) -> dict:
        return {**asdict(self), "mem_gbps": self.mem_gbps}

    @property
    def mem_gbps(self) -> float:
        return max(self.copy_gbps, self.read_gbps)

    def matmul_tflops(self, dtype: str) -> float:
        return self.fp8_tflops if dtype.startswith("fp8") and self.fp8_tflops > 0 else self.bf16_tflops


def measure_ceilings(size: int = 8192, copy_bytes: int = 4 << 30) -> Ceilings:
    """Measure copy bandwidth and bf16/fp8 matmul rates on the current GPU (a few seconds)."""
    gen = torch.Generator(device="cuda").manual_seed(1234)
    src = torch.randn(copy_bytes // 2, device="cuda", dtype=torch.bfloat16, generator=gen)
    dst = torch.empty_like(src)
    # A copy captured in a graph may run on the copy engines, slower than SM kernels: take the faster of both.
    t = min(time_graph(lambda: dst.copy_(src), min_reps=10, max_reps=30).median_us,
            time_eager(lambda: dst.copy_(src), min_reps=10, max_reps=30).median_us)
    copy_gbps = 2 * copy_bytes / (t * 1e-6) / 1e9
    # Read bandwidth: the fastest of a torch reduction and two shapes of streaming-read kernel.
    sms = DeviceLimits.current().sms
    total = torch.empty((), device="cuda", dtype=torch.float32)
    reads = [lambda: torch.sum(src, dim=0, dtype=torch.float32, out=total)]
    for per_sm, block, warps in ((8, 4096, 8), (16, 8192, 8), (32, 2048, 4)):
        partial = torch.empty(sms * per_sm, device="cuda", dtype=torch.float32)
        reads.append(lambda p=partial, b=block, w=warps: read_all(src, p, block=b, num_warps=w))
    matrix = src.view(-1, 8192)  # [R, 8192]
    row_sums = torch.empty(matrix.shape[0], device="cuda", dtype=torch.float32)
    reads.append(lambda: read_rows(matrix, row_sums))
    t = min(time_graph(fn, min_reps=10, max_reps=30).median_us for fn in reads)
    read_gbps = copy_bytes / (t * 1e-6) / 1e9

    flops = 2 * size**3
    bf16_mm, fp8_mm = ceiling_matmuls(size, gen)
    t = time_graph(bf16_mm, min_reps=10, max_reps=30)
    bf16_tflops = flops / (t.median_us * 1e-6) / 1e12

    fp8_tflops = 0.0
    try:
        t = time_graph(fp8_mm, min_reps=10, max_reps=30)
        fp8_tflops = flops / (t.median_us * 1e-6) / 1e12
    except RuntimeError:  # no fp8 tensor cores (pre-sm89)
        pass
    return Ceilings(copy_gbps, read_gbps, bf16_tflops, fp8_tflops)


def ceiling_matmuls(size: int, gen: torch.Generator | None = None):
    """The two dense products whose rates are the matmul ceilings, each `2 * size**3` FLOPs on random data:
    bf16 `torch.mm` and fp8 e4m3 `torch._scaled_mm` (unit scales) of [size, size] operands."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=gen)
    c = torch.empty_like(a)
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major, as _scaled_mm wants
    one = torch.ones((), device="cuda", dtype=torch.float32)
    return (lambda: torch.mm(a, b, out=c),
            lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16))


@dataclass(frozen=True)
class Floor:
    floor_us: float
    bound: str  # "memory" or "compute"
    bytes: int
    flops: int


def floor(problem: Problem, experts_touched: int, ceilings: Ceilings, flops: int | None = None) -> Floor:
    """The slower of moving the point's fewest bytes at the memory ceiling and its FLOPs (``flops``, else
    ``problem.flops``: every slot's) at its dtype's rate."""
    nbytes = problem.min_bytes(experts_touched)
    flops = problem.flops if flops is None else flops
    mem_us = nbytes / (ceilings.mem_gbps * 1e9) * 1e6
    cmp_us = flops / (ceilings.matmul_tflops(problem.dtype) * 1e12) * 1e6
    return Floor(max(mem_us, cmp_us), "memory" if mem_us >= cmp_us else "compute", nbytes, flops)
