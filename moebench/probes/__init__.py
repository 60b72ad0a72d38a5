"""Probes: measurements beside the benchmark that explain its figures.

Each probe is one module with its pure arithmetic tested on the CPU and its
measuring functions taking the device and a timer. ``bounds`` sets each point's
layer time beside the slower of a bare read of its bytes and cuBLAS's dense
GEMMs of its shapes: how near its floor the point could come on this machine.
"""
