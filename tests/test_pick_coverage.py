"""Which config a table holds where its rows at one M come from several problems (``tables.pick.best_configs``):
only configs measured on the most problems compete, so one timed on fewer, however fast there, is not picked
over one timed on every problem."""

from __future__ import annotations

import pandas as pd
import pytest

from moebench.tables.pick import best_configs
from moebench.tile import TileConfig

KEY = (8, 14336, "bf16", "NVIDIA H200")  # the table's (experts, intermediate, dtype, device)
A, B, C = TileConfig(16, 64, 64), TileConfig(32, 64, 64), TileConfig(64, 128, 64)


def row(config: TileConfig, time_us: float, M: int = 16, **problem) -> dict:
    """An ok GPU row of moebench's kernel at M, on the problem ``problem`` changes (routing, hidden, top-k)."""
    r = {"model": "mixtral-8x7b", "experts": 8, "hidden": 4096, "intermediate": 14336, "topk": 2, "M": M,
         "dtype": "bf16", "path": "triton", "routing": "uniform", "config": config.as_dict(), "status": "ok",
         "correct": True, "time_us": time_us, "device_name": "NVIDIA H200", "interpreter": False, "phase": None}
    r.update(problem)
    return r


def pick(rows: list[dict], M: int = 16) -> TileConfig:
    return best_configs(pd.DataFrame(rows), path="triton")[KEY][M]


# (rows, the config picked, why)
CASES = [
    pytest.param([row(A, 80.0), row(B, 100.0), row(B, 200.0, routing="skewed")], B,
                 id="fastest-on-one-routing-of-two"),  # A: timed uniform only, 20% ahead of B there
    pytest.param([row(A, 50.0), row(A, 55.0), row(B, 100.0), row(B, 120.0, hidden=5120)], B,
                 id="two-rows-of-one-problem-count-once"),  # A's two rows are one problem; B ran two shapes
    pytest.param([row(A, 110.0), row(A, 300.0, topk=4), row(B, 80.0), row(C, 100.0), row(C, 280.0, topk=4)], C,
                 id="the-best-of-those-on-the-most-problems"),  # B on one only; C ahead of A on both
]


@pytest.mark.parametrize("rows, picked", CASES)
def test_a_config_measured_on_fewer_problems_is_not_picked(rows, picked):
    """The config picked is the best (mean time over each problem's fastest) of those measured on the most
    problems (here every problem the rows hold), though a config measured on fewer is faster where it ran."""
    df = pd.DataFrame(rows)
    problems = df[["hidden", "topk", "routing"]].drop_duplicates()
    fastest = df.loc[df["time_us"].idxmin(), "config"]
    assert len(problems) > 1 and TileConfig.from_dict(fastest) != picked  # precondition: a faster, narrower config
    assert pick(rows) == picked


def test_with_one_problem_the_fastest_config_is_picked():
    """The filter leaves one problem's rows alone: the lowest time wins."""
    assert pick([row(A, 80.0), row(B, 100.0), row(C, 90.0)]) == A
