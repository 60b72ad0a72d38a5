"""For the path tests: a path prepared on inputs and checked as the sweep checks it (``measure.point.check_run``
on the closure ``prepare`` returned)."""

from __future__ import annotations

import torch

from moebench.measure.point import Check, check_run
from moebench.paths.base import MoEPath
from moebench.problem import MoEInputs, Problem
from moebench.tile import TileConfig


def check_point(path: MoEPath, problem: Problem, inputs: MoEInputs, config: TileConfig | None = None,
                ref: torch.Tensor | None = None) -> Check:
    """Prepare ``path`` on ``inputs`` (a tunable path at ``config``, or its default) and check it once."""
    if path.tunable and config is None:
        config = path.default_config(problem)
    return check_run(path.prepare(inputs, problem, config), problem, inputs, ref)
