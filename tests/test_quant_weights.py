"""Weight quantization one expert at a time (``quant.quantize_into``, what ``make_weights`` builds with) gives the
bits of ``quant.quantize_weight`` over the whole tensor, for every scheme."""

from __future__ import annotations

import pytest
import torch

from moebench.models import MoEShape
from moebench.problem import make_weights
from moebench.quant import empty_quantized, quantize_into, quantize_weight, scale_shape


@pytest.mark.parametrize("scheme, block", [("tensor", (128, 128)), ("channel", (128, 128)), ("block128", (128, 128)),
                                           ("block128", (64, 64))])
def test_into_matches_whole_tensor(scheme, block):
    torch.manual_seed(0)
    w = torch.randn(3, 200, 136) * torch.tensor([0.5, 2.0, 9.0])[:, None, None]  # N, K not multiples of a block
    q, s = empty_quantized(w, scheme, block)
    quantize_into(w, scheme, q, s, block)
    q_ref, s_ref = quantize_weight(w, scheme, block)
    assert s.shape == s_ref.shape == scale_shape((3, 200, 136), scheme, block)
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("dtype", ["fp8-tensor", "fp8-channel", "fp8-block128", "fp8-tensor-static"])
def test_make_weights_is_the_whole_tensor_quantization(dtype):
    shape = MoEShape("q", experts=4, hidden=160, intermediate=96, topk=2, moe_layers=1)
    w = make_weights(shape, dtype, 3, "cpu")
    gen = torch.Generator().manual_seed(3)  # the draws make_weights makes, in its order
    w13 = torch.randn(4, 192, 160, generator=gen, dtype=torch.bfloat16) * 160**-0.5
    w2 = torch.randn(4, 160, 96, generator=gen, dtype=torch.bfloat16) * 96**-0.5
    for (q, s), (q_ref, s_ref) in (((w.w13, w.w13_scale), quantize_weight(w13, w.fp8_scheme)),
                                   ((w.w2, w.w2_scale), quantize_weight(w2, w.fp8_scheme))):
        assert torch.equal(s, s_ref)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
