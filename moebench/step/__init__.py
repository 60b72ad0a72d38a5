"""One GPU's shard of a served model, layer by layer: its shapes (``config``), each kind of layer built and checked
(``parts``, ``measure``), summed over the model's layer counts (``compose``), and the run behind ``moebench step``
(``run``). Importing this package loads no torch: ``config`` and ``compose`` are plain arithmetic."""
