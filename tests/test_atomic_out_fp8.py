"""GEMM2's top-k sum adding straight into the output (``atomic_out``) with fp8 weights, on the Triton
interpreter too: the activations and the output in fp16 or float32 (the interpreter has atomics in both, none in
bf16, the dtype an fp8 point's output has in a sweep), the weights and their scales as an fp8 problem builds them.
The layer matches the float32 reference within the fp8 tolerance and the float32-buffer form of the same sum
within the output dtype's rounding. On a GPU the same cases run there, and ``test_paths`` checks the bf16 output."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from moebench.dtypes import DTYPES
from moebench.kernels.fused_moe import DeviceFacts, LayerShapes, fused_moe, launch_plan
from moebench.kernels.tiles import QUANT_NONE
from moebench.models import MoEShape
from moebench.paths.base import Target, triton_supports
from moebench.paths.registry import get_path
from moebench.paths.torch_ref import moe_reference
from moebench.problem import Problem, make_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OUT_DTYPE = {"fp16": torch.float16, "fp32": torch.float32}

# (fp8 dtype, output dtype, top-k of 6 experts, swap_ab)
CASES = [
    ("fp8-tensor", "fp16", 2, False),  # one scale per weight tensor, activations scaled per batch
    ("fp8-tensor-static", "fp16", 6, True),  # static activation scales; top-6 of 6: six adds into each element
    ("fp8-channel", "fp16", 2, True),  # a scale per output row, applied in GEMM2's epilogue before the add
    ("fp8-block128", "fp16", 6, False),  # 128x128 block scales in the K loop
    ("fp8-block128", "fp32", 2, True),  # float32 adds into the output
    ("fp8-channel", "fp32", 6, False),
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(a.float() - b.float()) / torch.linalg.vector_norm(b.float())).item()


@pytest.mark.parametrize("dtype, out_name, topk, swap_ab", CASES)
def test_fp8_atomic_sum_into_the_output_matches_reference(dtype, out_name, topk, swap_ab):
    """hidden 96 and I 48 (off the tiles: K and column tails), 33 tokens: the output, poisoned with NaN, holds
    the float32 reference within the dtype's tolerance and the float32-buffer sum within the output's rounding."""
    problem = Problem(MoEShape("t", 6, 96, 48, topk), 33, dtype, seed=4)
    if why := triton_supports(problem, Target.current()):
        pytest.skip(why)  # a GPU without fp8 tensor cores
    inp = make_inputs(problem, DEVICE, draw=1)
    w = inp.weights
    act = OUT_DTYPE[out_name]
    x = inp.x.to(act)  # bf16 values, exact in fp16 and float32
    cfg = replace(get_path("triton").default_config(problem), swap_ab=swap_ab, atomic_sum=True, atomic_out=True)

    def layer(config) -> torch.Tensor:
        out = torch.full((problem.M, problem.shape.hidden), float("nan"), device=DEVICE, dtype=act)
        fused_moe(x, w.w13, w.w2, inp.topk_weights, inp.topk_ids, config, out=out, fp8_scheme=w.fp8_scheme,
                  w13_scale=w.w13_scale, w2_scale=w.w2_scale, act_scale=w.act_scale)
        return out

    plan = launch_plan(cfg, w.fp8_scheme, LayerShapes.of(x, w.w13, inp.topk_ids, act_scale=w.act_scale),
                       DeviceFacts.of(x.device))
    assert plan.sums == "out" and plan.quant != QUANT_NONE  # the case reaches fp8 atomics into the output
    out = layer(cfg)
    assert out.dtype == act and torch.isfinite(out).all()  # every element zeroed, then added into
    ref = moe_reference(x, w, inp.topk_weights, inp.topk_ids)
    assert rel(out, ref) <= DTYPES[dtype].rtol, f"rel. error {rel(out, ref):.4f} against the float32 reference"
    buffered = layer(replace(cfg, atomic_out=False))  # the same sum in a float32 buffer, then cast
    assert rel(out, buffered) <= DTYPES[out_name].rtol, f"{rel(out, buffered):.2e} from the float32-buffer sum"
