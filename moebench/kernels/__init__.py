"""moebench's own Triton kernels."""
