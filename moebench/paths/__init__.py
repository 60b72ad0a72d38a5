"""Interchangeable implementations of the whole MoE layer (triton, triton-classic, cutlass, torch).

``base`` holds the interface and ``Target``; ``registry`` names every path. Neither is imported here, so
``moebench.paths.base`` loads no kernel.
"""
