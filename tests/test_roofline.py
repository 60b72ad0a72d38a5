"""The roofline floor and the streaming-read kernel behind the memory ceiling."""

from __future__ import annotations

import pytest
import torch

from moebench.kernels.stream import read_all, read_rows
from moebench.measure.roofline import Ceilings, floor
from moebench.models import MoEShape
from moebench.problem import Problem

CEIL = Ceilings(copy_gbps=4000.0, read_gbps=4500.0, bf16_tflops=800.0, fp8_tflops=1500.0)
SHAPE = MoEShape("m", experts=8, hidden=4096, intermediate=14336, topk=2)


def test_decode_is_memory_bound_on_the_faster_bandwidth():
    """M=1: floor = bytes of the touched experts / max(copy, read) bandwidth."""
    p = Problem(SHAPE, 1, "bf16")
    f = floor(p, experts_touched=2, ceilings=CEIL)
    expected_bytes = 2 * 3 * 14336 * 4096 * 2 + 2 * 1 * 4096 * 2
    assert f.bound == "memory" and f.bytes == expected_bytes
    assert f.floor_us == pytest.approx(expected_bytes / 4500e9 * 1e6)


def test_prefill_is_compute_bound_on_the_dtype_rate():
    """M=4096: floor = 2*M*topk*3*I*K FLOPs over the bf16 (or fp8) matmul rate."""
    for dtype, rate in (("bf16", 800.0), ("fp8-tensor", 1500.0)):
        p = Problem(SHAPE, 4096, dtype)
        f = floor(p, experts_touched=8, ceilings=CEIL)
        assert f.bound == "compute"
        assert f.floor_us == pytest.approx(2 * 4096 * 2 * 3 * 14336 * 4096 / (rate * 1e12) * 1e6)


def test_fp8_weights_count_one_byte_and_their_scales():
    bf16 = Problem(SHAPE, 1, "bf16").min_bytes(2)
    fp8 = Problem(SHAPE, 1, "fp8-channel").min_bytes(2)
    act = 2 * 4096 * 2
    assert fp8 - act == (bf16 - act) // 2 + 2 * 4 * (2 * 14336 + 4096)


@pytest.mark.parametrize("n, programs, block", [(1000, 3, 128), (4096, 4, 1024), (12345, 7, 512)])
def test_read_kernel_reads_every_element_once(n, programs, block):
    """The ceiling kernel's partial sums add up to the sum of the buffer: it read all of it, once."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(n, device=device)
    partial = torch.full((programs,), float("nan"), device=device)
    read_all(x, partial, block=block)
    assert torch.isfinite(partial).all()
    assert partial.sum().item() == pytest.approx(x.sum().item(), rel=1e-4, abs=1e-3)


def test_row_read_kernel_reads_every_row():
    """The matrix-shaped ceiling kernel returns each row's sum: every tile was read once."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    w = torch.randn(128, 512, device=device).half()
    out = torch.full((128,), float("nan"), device=device)
    read_rows(w, out, block_r=64, block_c=256)
    torch.testing.assert_close(out, w.float().sum(dim=1), rtol=1e-3, atol=1e-2)
