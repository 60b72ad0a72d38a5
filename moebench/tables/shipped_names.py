"""The config files the engines' releases ship for the H200, by name: the ones moebench carries, not every one.

doctor names them where the engine is not installed here (what its own folder would hold), and export warns where a
plain export writes a file of such a name (which then shadows the shipped one at every M). A name missing here
says nothing about whether the release ships it.
"""

from __future__ import annotations

RELEASES = {"vllm": "vLLM 0.33", "sglang": "SGLang 0.5.23"}  # the releases the names below are of
SHIPPED = {
    "vllm": frozenset({
        "E=128,N=768,device_name=NVIDIA_H200.json",  # Qwen3-30B-A3B bf16
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",  # DeepSeek-V3@tp8 fp8
    }),
    "sglang": frozenset({
        # DeepSeek-V3@tp8 fp8-block128, the shared expert fused (E=256+1)
        "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json",
    }),
}


def ships(engine: str, name: str) -> bool | None:
    """True where the engine's release ships ``name``; None where moebench does not know (not in its list)."""
    return True if name in SHIPPED.get(engine, ()) else None
