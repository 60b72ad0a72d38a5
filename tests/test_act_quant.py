"""Activation quantization kernels against the torch definitions in moebench.quant."""

from __future__ import annotations

import pytest
import torch

from moebench.kernels.act_quant import quantize_act
from moebench.quant import FP8_MAX, quantize_rows, quantize_static, quantize_tensor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)  # reproducible draws; the checks hold for any draw


@pytest.mark.parametrize("rows, cols", [(1, 64), (7, 300), (33, 1024)])  # one row; K not a multiple of 128; wide
def test_per_token_matches_torch(rows, cols):
    x = torch.randn(rows, cols, device=DEVICE) * 3
    q, s = quantize_act(x, "channel")
    q_ref, s_ref = quantize_rows(x)
    torch.testing.assert_close(s, s_ref)
    assert torch.equal(q.float(), q_ref.float())


def test_per_tensor_matches_torch_and_has_one_scale():
    x = torch.randn(19, 200, device=DEVICE).bfloat16()
    q, s = quantize_act(x, "tensor")
    q_ref, s_ref = quantize_tensor(x)
    assert s.shape == (1,)
    torch.testing.assert_close(s[0], s_ref)
    assert torch.equal(q.float(), q_ref.float())


def test_per_tensor_scale_from_maxima_of_parts_is_the_same():
    """Given the maxima of parts that cover x (as GEMM1's tiles of h), the per-tensor quantization reads no row
    maxima of its own and gives the same scale and bits; a zero entry (a program with no tile) changes nothing.
    Maxima give a per-tensor scale only."""
    x = torch.randn(21, 300, device=DEVICE).bfloat16() * 3
    parts = [x[:5, :100], x[:5, 100:], x[5:, :200], x[5:, 200:]]
    maxima = torch.stack([p.float().abs().max() for p in parts] + [torch.zeros((), device=DEVICE)])
    q, s = quantize_act(x, "tensor", maxima=maxima)
    q_ref, s_ref = quantize_act(x, "tensor")
    assert torch.equal(s, s_ref)
    assert torch.equal(q.float(), q_ref.float())
    with pytest.raises(ValueError, match="per-tensor"):
        quantize_act(x, "channel", maxima=maxima)


def test_static_scale_matches_torch_and_clips():
    """A scale given ahead is used as is (one launch, no maxima): values past +-448 * scale clip."""
    x = torch.randn(9, 300, device=DEVICE).bfloat16() * 4
    scale = torch.tensor([6.0 / FP8_MAX], device=DEVICE)  # below the batch's amax: some values clip
    q, s = quantize_act(x, "tensor", static_scale=scale)
    assert s is scale
    assert torch.equal(q.float(), quantize_static(x, scale).float())
    assert q.float().abs().max().item() == FP8_MAX and (x.float().abs() > 6.0).any()
    with pytest.raises(ValueError, match="per tensor"):
        quantize_act(x, "channel", static_scale=scale)


@pytest.mark.parametrize("rows", [1, 5, 70])  # fewer rows than one program's block; more than two blocks
def test_block128_groups_round_trip(rows):
    """Each 1x128 group has its own scale; dequantized values are within half an e4m3 step of the input."""
    x = torch.randn(rows, 300, device=DEVICE)
    x[:, 128:256] *= 100  # groups of very different range get different scales
    x[rows // 2] *= 1e-3  # and rows of very different range too
    q, s = quantize_act(x, "block128")
    assert s.shape == (rows, 3)
    groups = torch.nn.functional.pad(x, (0, 84)).view(rows, 3, 128)
    torch.testing.assert_close(s, groups.abs().amax(dim=2) / FP8_MAX)
    back = q.float() * s.repeat_interleave(128, dim=1)[:, :300]
    assert ((back - x).abs() <= x.abs() / 16 + s.repeat_interleave(128, dim=1)[:, :300]).all()


def test_values_that_round_up_across_a_power_of_two():
    """126.0 / scale rounds to 128 in e4m3 (the interpreter's own cast would give 64)."""
    x = torch.tensor([[448.0, 126.0, -127.0, 31.7, 0.001]], device=DEVICE)
    q, s = quantize_act(x, "channel")
    assert s.item() == 1.0
    assert q.float().tolist() == x.to(torch.float8_e4m3fn).float().tolist()  # torch's cast, scale 1
    assert q.float()[0, 1].item() == 128.0


def test_every_e4m3_value_and_midpoint_casts_like_torch():
    """With scale 1 (the row holds 448), each e4m3 value and each midpoint between two (a tie, to even)."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = torch.unique(grid[torch.isfinite(grid) & (grid >= 0)])  # ascending e4m3 values in [0, 448]
    mids = (grid[1:] + grid[:-1]) / 2
    x = torch.cat([grid, mids, -mids])[None].to(DEVICE)  # [1, K]
    q, s = quantize_act(x, "channel")
    assert s.item() == 1.0
    assert torch.equal(q.float(), x.to(torch.float8_e4m3fn).float())
