"""Serving: the library call (``moebench.fused_moe``), warm-up ahead of traffic, and the JIT audit by trace replay."""
