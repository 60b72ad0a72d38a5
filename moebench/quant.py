"""FP8 (e4m3) quantization of expert weights and activations, in plain torch.

Weights are quantized once, on the host side of a benchmark, so this code is
not timed. Activation quantization here serves the CUTLASS path and the
reference; it has no host synchronization, so it can be captured in a graph.

Scale conventions (dequantized value = fp8 value * scale):
- ``tensor``:   w [E, N, K] -> scale [E]                  one per expert matrix
- ``channel``:  w [E, N, K] -> scale [E, N]               one per output row
- ``block128``: w [E, N, K] -> scale [E, cdiv(N,128), cdiv(K,128)]; other blocks ``block=(block_n, block_k)``
  give scale [E, cdiv(N, block_n), cdiv(K, block_k)]
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448.0
BLOCK = 128
_EPS = 1e-12


def quantize_weight(w: torch.Tensor, scheme: str,
                    block: tuple[int, int] = (BLOCK, BLOCK)) -> tuple[torch.Tensor, torch.Tensor]:
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
        bn, bk = block
        nb, kb = -(-N // bn), -(-K // bk)
        padded = torch.zeros(E, nb * bn, kb * bk, device=w.device)
        padded[:, :N, :K] = w
        blocks = padded.view(E, nb, bn, kb, bk)
        scale = blocks.abs().amax(dim=(2, 4)).clamp_min(_EPS) / FP8_MAX  # [E, nb, kb]
        q = (blocks / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
        q = q.view(E, nb * bn, kb * bk)[:, :N, :K].to(FP8).contiguous()
    else:
        raise ValueError(f"unknown fp8 scheme {scheme!r}")
    return q, scale


def scale_shape(shape: tuple[int, int, int], scheme: str, block: tuple[int, int] = (BLOCK, BLOCK)) -> tuple[int, ...]:
    """The shape of ``quantize_weight``'s scale for a weight of ``shape`` [E, N, K]."""
    E, N, K = shape
    if scheme == "tensor":
        return (E,)
    if scheme == "channel":
        return (E, N)
    if scheme == "block128":
        return (E, -(-N // block[0]), -(-K // block[1]))
    raise ValueError(f"unknown fp8 scheme {scheme!r}")


def empty_quantized(w: torch.Tensor, scheme: str,
                    block: tuple[int, int] = (BLOCK, BLOCK)) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialized (fp8 [E, N, K], float32 scale) for ``quantize_into``."""
    return (torch.empty(w.shape, dtype=FP8, device=w.device),
            torch.empty(scale_shape(tuple(w.shape), scheme, block), dtype=torch.float32, device=w.device))


def quantize_into(w: torch.Tensor, scheme: str, q: torch.Tensor, scale: torch.Tensor,
                  block: tuple[int, int] = (BLOCK, BLOCK)) -> None:
    """``quantize_weight(w, scheme)`` written into ``q`` and ``scale`` (of ``empty_quantized``) one expert at a
    time: the float32 temporaries are one expert's, not the whole tensor's 4 bytes per weight, and outputs
    allocated before them never sit inside a freed temporary's block of CUDA's caching allocator, where they
    would keep the whole block from going back to the GPU (compile workers held 8 GiB each that way)."""
    for e in range(w.shape[0]):
        qe, se = quantize_weight(w[e : e + 1], scheme, block)
        q[e].copy_(qe[0])
        scale[e].copy_(se[0])


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor | None, scheme: str | None,
                      block: tuple[int, int] = (BLOCK, BLOCK)) -> torch.Tensor:
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
        s = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:N, :K]
        return w * s
    raise ValueError(f"unknown fp8 scheme {scheme!r}")


CALIBRATION_TOKENS = 256  # tokens of the batch that static activation scales are calibrated on
CALIBRATION_EXPERTS = 8  # experts it runs through


def static_act_scales(w13: torch.Tensor, act_dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Static per-tensor activation scales [2] float32 (GEMM1's input, GEMM2's input), calibrated as a
    checkpoint's are: amax / 448 over a calibration batch, drawn as ``problem.make_inputs`` draws x
    (standard normal), through the first experts of w13 [E, 2I, H] (unquantized). Values of a
    later batch beyond the calibrated range are clipped to +-448 when quantized."""
    E, two_i, H = w13.shape
    x = torch.randn(CALIBRATION_TOKENS, H, generator=gen, device=w13.device, dtype=act_dtype).float()
    h_amax = torch.zeros((), device=w13.device)
    for e in range(min(E, CALIBRATION_EXPERTS)):
        gate_up = x @ w13[e].float().T  # [tokens, 2I]
        h = torch.nn.functional.silu(gate_up[:, : two_i // 2]) * gate_up[:, two_i // 2 :]  # [tokens, I]
        h_amax = torch.maximum(h_amax, h.abs().amax())
    return (torch.stack([x.abs().amax(), h_amax]).clamp_min(_EPS) / FP8_MAX).float()


def quantize_static(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [T, K] in fp8 at a given scale ([] or [1]); values beyond +-448 * scale are clipped."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


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
