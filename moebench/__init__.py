"""moebench: benchmark and autotune fused Mixture-of-Experts kernels on Hopper GPUs."""

from moebench import _interpret  # noqa: F401  (must run before any kernel is decorated)

__version__ = "0.1.0"
