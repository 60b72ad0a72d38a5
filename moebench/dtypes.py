"""Dtype names used everywhere (CLI, specs, rows) and the one tolerance table.

A *dtype name* says how the expert weights and activations are stored:

- ``bf16``, ``fp16``, ``fp32``: plain floating point (``fp16``/``fp32`` exist so
  that CPU runs under the Triton interpreter, whose bf16 ``tl.dot`` is wrong,
  can still check the kernels' logic);
- ``fp8-tensor``: e4m3 weights with one scale per expert tensor, one dynamic activation scale
  per GEMM input (the amax of the batch);
- ``fp8-tensor-static``: the same weights, with static activation scales calibrated ahead
  (as a checkpoint's input scales are), so no activation amax is taken at run time;
- ``fp8-channel``: e4m3 weights with one scale per output channel, per-token
  activation scales;
- ``fp8-block128``: e4m3 weights with one scale per 128x128 block, 1x128
  activation groups (DeepSeek-V3 style).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from moebench.errors import UserError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DtypeSpec:
    name: str
    weight_name: str  # the torch dtype (attribute of ``torch``) that stores w13 / w2
    act_name: str  # the torch dtype of the activations x and the output
    fp8_scheme: str | None  # None, "tensor", "channel" or "block128"
    rtol: float  # bound on ||out - ref|| / ||ref|| against the float32 reference
    vllm_suffix: str  # the ",dtype=..." part of vLLM's config file names
    static_act: bool = False  # fp8-tensor only: activation scales fixed ahead, not taken per batch

    @property
    def is_fp8(self) -> bool:
        return self.fp8_scheme is not None

    @property
    def weight(self) -> torch.dtype:
        """The storage dtype of w13 / w2 (imports torch: the table itself stays light for `--help`)."""
        import torch

        return getattr(torch, self.weight_name)

    @property
    def act(self) -> torch.dtype:
        """The dtype of the activations x and the output."""
        import torch

        return getattr(torch, self.act_name)

    @property
    def weight_bytes(self) -> int:
        return self.weight.itemsize

    @property
    def act_bytes(self) -> int:
        return self.act.itemsize


FP8 = "float8_e4m3fn"
BF16 = "bfloat16"

# Relative Frobenius error bounds. bf16 rounds the [T, I] intermediate and the
# output to 8 mantissa bits (~4e-3 each); e4m3 activations carry 3 bits (~3e-2
# per GEMM on random data); fp32 dots run as tf32 on the GPU (~1e-3 through both GEMMs).
DTYPES: dict[str, DtypeSpec] = {
    d.name: d
    for d in (
        DtypeSpec("bf16", BF16, BF16, None, 2e-2, ""),
        DtypeSpec("fp16", "float16", "float16", None, 5e-3, ""),
        DtypeSpec("fp32", "float32", "float32", None, 5e-3, ",dtype=float32"),
        DtypeSpec("fp8-tensor", FP8, BF16, "tensor", 8e-2, ",dtype=fp8_w8a8"),
        DtypeSpec("fp8-tensor-static", FP8, BF16, "tensor", 8e-2, ",dtype=fp8_w8a8", static_act=True),
        DtypeSpec("fp8-channel", FP8, BF16, "channel", 8e-2, ",dtype=fp8_w8a8"),
        DtypeSpec(
            "fp8-block128", FP8, BF16, "block128", 8e-2,
            ",dtype=fp8_w8a8,block_shape=[128,128]",
        ),
    )
}


DTYPE_NAMES = ", ".join(DTYPES)  # for help texts and messages: read here, never typed again


def get_dtype(name: str) -> DtypeSpec:
    try:
        return DTYPES[name]
    except KeyError:
        raise UserError(f"unknown dtype {name!r}; known: {DTYPE_NAMES}") from None
