"""Benchmark sweeps: the spec (YAML or flags) and its plan, the executor that runs it point by point, the
shipped specs."""
