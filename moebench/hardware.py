"""The limits of the GPU that tile choices depend on, read from the device.

Split-K sizes its grid to the SM count, the tuner compares a top-k sum with
the L2 size, and pipelined tiles must fit in a block's shared memory. These
come from the device a run targets; without a GPU (the Triton interpreter)
they are those of an H100/H200 SXM, the GPUs moebench is made for.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceLimits:
    sms: int  # streaming multiprocessors
    l2_bytes: int  # L2 cache size
    smem_bytes: int  # shared memory one block may use (opt-in maximum)

    def __post_init__(self) -> None:
        if min(self.sms, self.l2_bytes, self.smem_bytes) <= 0:
            raise ValueError(f"device limits must be positive: {self}")

    @classmethod
    def current(cls) -> DeviceLimits:
        """The current CUDA device's limits, or ``HOPPER`` where there is none."""
        import torch

        if not torch.cuda.is_available():
            return HOPPER
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        smem = getattr(props, "shared_memory_per_block_optin", 0) or HOPPER.smem_bytes
        return cls(props.multi_processor_count, props.L2_cache_size, smem)


HOPPER = DeviceLimits(sms=132, l2_bytes=50 * 2**20, smem_bytes=227 * 1024)  # H100/H200 SXM
