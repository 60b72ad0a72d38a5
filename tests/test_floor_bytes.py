"""The bytes of the roofline floor (``Problem.min_bytes``, read by ``measure.roofline.floor``) for fp8 weights with
one scale per 128x128 block: every one of the three weight matrices (gate, up, down) brings its scales."""

from __future__ import annotations

import pytest

from moebench.measure.roofline import Ceilings, floor
from moebench.models import MoEShape
from moebench.problem import Problem, make_weights

BLOCK = 128
CEIL = Ceilings(copy_gbps=4000.0, read_gbps=4500.0, bf16_tflops=800.0, fp8_tflops=1500.0)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_scales(rows: int, cols: int) -> int:
    """The scales of one [rows, cols] weight with one scale per 128x128 block."""
    return cdiv(rows, BLOCK) * cdiv(cols, BLOCK)


# (experts, hidden, intermediate, topk): hidden and intermediate multiples of 128, unequal, so that the gate and
# up matrices [I, hidden] and the down matrix [hidden, I] hold different counts of blocks than a square would
SHAPES = [
    (8, 512, 384, 2),  # hidden 4 blocks, I 3 blocks: 12 scales per matrix
    (4, 256, 1024, 1),  # I larger than hidden: 16 scales per matrix
    (16, 7168, 256, 8),  # DeepSeek-V3's hidden at tp8's I: 56 x 2 blocks
]


@pytest.mark.parametrize("experts, hidden, intermediate, topk", SHAPES)
def test_block128_bytes_count_the_scales_of_gate_up_and_down(experts, hidden, intermediate, topk):
    """Per touched expert: its three e4m3 matrices at one byte a weight and each matrix's float32 block scales;
    plus the activations read and the output written, each bf16."""
    shape = MoEShape("m", experts=experts, hidden=hidden, intermediate=intermediate, topk=topk)
    p = Problem(shape, 3, "fp8-block128")
    gate = up = block_scales(intermediate, hidden)  # [I, hidden] each
    down = block_scales(hidden, intermediate)  # [hidden, I]
    per_expert = 3 * intermediate * hidden * 1 + 4 * (gate + up + down)
    activations = 2 * 3 * hidden * 2  # x read once, the output written once, [M, hidden] bf16 each
    for touched in (1, experts):
        assert p.min_bytes(touched) == touched * per_expert + activations
    f = floor(p, experts_touched=2, ceilings=CEIL, flops=0)  # flops 0: the memory side sets the floor
    assert f.bytes == 2 * per_expert + activations and f.bound == "memory"
    assert f.floor_us == pytest.approx(f.bytes / (CEIL.mem_gbps * 1e9) * 1e6)


@pytest.mark.parametrize("dtype, hidden, intermediate", [
    ("fp8-block128", 512, 384),  # whole blocks
    ("fp8-block128", 320, 192),  # I = 1.5 blocks: w13's 2I is 3 blocks, not 2 x 2 (a partial block per matrix)
    ("fp8-channel", 320, 192),  # one scale per output row: 2I of w13, hidden of w2
    ("fp8-tensor", 256, 128),  # one scale per matrix and expert
])
def test_scale_bytes_are_those_of_the_scales_the_weights_carry(dtype, hidden, intermediate):
    """The floor's scale bytes equal those of the scale tensors ``make_weights`` builds for the kernels to
    read (w13 [E, 2I, hidden] and w2 [E, hidden, I]), for each fp8 scheme."""
    experts = 2
    shape = MoEShape("m", experts=experts, hidden=hidden, intermediate=intermediate, topk=1)
    p = Problem(shape, 1, dtype)
    w = make_weights(shape, dtype, seed=0, device="cpu")
    scale_bytes = (w.w13_scale.numel() + w.w2_scale.numel()) * w.w13_scale.element_size()  # all experts
    weight_bytes = w.w13.numel() * w.w13.element_size() + w.w2.numel() * w.w2.element_size()
    assert p.min_bytes(experts) == weight_bytes + scale_bytes + 2 * 1 * hidden * 2


def test_block128_scale_bytes_are_those_of_the_scales_the_weights_carry():
    """The floor's scale bytes equal those of the scale tensors ``make_weights`` builds for the kernels to
    read (w13 [E, 2I, hidden] and w2 [E, hidden, I], one float32 per 128x128 block)."""
    experts, hidden, intermediate = 2, 512, 384
    shape = MoEShape("m", experts=experts, hidden=hidden, intermediate=intermediate, topk=1)
    p = Problem(shape, 1, "fp8-block128")
    w = make_weights(shape, "fp8-block128", seed=0, device="cpu")
    scale_bytes = (w.w13_scale.numel() + w.w2_scale.numel()) * w.w13_scale.element_size()  # all experts
    weight_bytes = w.w13.numel() * w.w13.element_size() + w.w2.numel() * w.w2.element_size()
    activations = 2 * 1 * hidden * 2
    assert p.min_bytes(experts) == weight_bytes + scale_bytes + activations
    assert w.w13_scale.numel() == experts * 2 * block_scales(intermediate, hidden)  # the test's own count agrees
