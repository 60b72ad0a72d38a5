"""FP8 (e4m3) quantization of expert weights and activations, in plain torch.

Weights are quantized once, on the host side of a benchmark, so this code is
not timed. Activation quantization here serves the CUTLASS path and the
reference; it has no host synchronization, so it can be captured in a graph.

Scale conventions (dequantized value = fp8 value * scale):
- ``tensor``:   w [E, N, K] -> scale [E]                  one per expert matrix
- ``channel``:  w [E, N, K] -> scale [E, N]               one per output row
- ``block128``: w [E, N, K] -> scale [E, cdiv(N,128), cdiv(K,128)]
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448.0
BLOCK = 128
_EPS = 1e-12


def quantize_weight(w: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, N, K] (any float dtype) -> (fp8 [E, N, K], float32 scale, shaped as the module doc says)."""
    w = w.float()
    E, N, K = w.shape
    if scheme == "tensor":
        scale = w.abs().amax(dim=(1, 2)).clamp_min(_EPS) / FP8_MAX  # [E]
        q = (w / scale[:, None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    elif scheme == "channel":
        scale = w.abs().amax(dim=2).clamp_min(_EPS) / FP8_MAX  # [E, N]
        q = (w / scale[:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    elif scheme == "block128":
        nb, kb = -(-N // BLOCK), -(-K // BLOCK)
        padded = torch.zeros(E, nb * BLOCK, kb * BLOCK, device=w.device)
        padded[:, :N, :K] = w
        blocks = padded.view(E, nb, BLOCK, kb, BLOCK)
        scale = blocks.abs().amax(dim=(2, 4)).clamp_min(_EPS) / FP8_MAX  # [E, nb, kb]
        q = (blocks / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
        q = q.view(E, nb * BLOCK, kb * BLOCK)[:, :N, :K].to(FP8).contiguous()
    else:
        raise ValueError(f"unknown fp8 scheme {scheme!r}")
    return q, scale


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor | None, scheme: str | None) -> torch.Tensor:
    """The float32 value of one expert's weight. q [N, K], scale as above without the E dim."""
    w = q.float()
    if scheme is None:
        return w
    if scheme == "tensor":
        return w * scale
    if scheme == "channel":
        return w * scale[:, None]
    if scheme == "block128":
        N, K = w.shape
        s = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:N, :K]
        return w * s
    raise ValueError(f"unknown fp8 scheme {scheme!r}")


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (per-token) dynamic quantization: x [T, K] -> (fp8 [T, K], float32 scale [T])."""
    scale = x.float().abs().amax(dim=1).clamp_min(_EPS) / FP8_MAX  # [T]
    q = (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def quantize_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor dynamic quantization: x [T, K] -> (fp8 [T, K], float32 scale [] ), no host sync."""
    scale = x.float().abs().amax().clamp_min(_EPS) / FP8_MAX  # []
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale
