"""Interchangeable implementations of the whole MoE layer: triton, cutlass, torch."""

from moebench.paths.base import MoEPath, Target, get_path, path_names

__all__ = ["MoEPath", "Target", "get_path", "path_names"]
