"""moebench: benchmark and autotune fused Mixture-of-Experts kernels on Hopper GPUs.

Importing the package imports neither torch nor Triton: the command line stays fast, and the kernels
(``moebench.kernels``) turn on the Triton interpreter where there is no GPU when they are first imported.
"""

__version__ = "0.1.0"
