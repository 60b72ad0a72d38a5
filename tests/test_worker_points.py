"""A worker keeps the inputs and float32 reference of each M it was asked for (``jobs._point``), so a tune that
returns to an M rebuilds nothing, and drops the oldest once they pass ``POINTS_BYTES``."""

from __future__ import annotations

from moebench.models import get_model
from moebench.problem import Problem
from moebench.workers import jobs


def test_a_point_is_built_once_per_m_and_the_oldest_dropped_over_the_bound(monkeypatch):
    tiny = get_model("tiny")
    p1, p2, p3 = (Problem(tiny, M, "fp16") for M in (3, 2, 1))  # the last the smallest
    jobs.release()
    try:
        first = jobs._point(p1, reference=True)
        jobs._point(p2, reference=True)
        again = jobs._point(p1, reference=False)
        assert again[0] is first[0] and again[1] is first[1], "M=1's inputs or reference were rebuilt"
        assert list(jobs._state["points"]) == [p2, p1]  # the newest last
        two = sum(jobs._point_bytes(p) for p in jobs._state["points"].values())
        monkeypatch.setattr(jobs, "POINTS_BYTES", two)
        jobs._point(p3, reference=True)  # three points pass the bound: the oldest (M=2) goes, then they fit
        assert list(jobs._state["points"]) == [p1, p3]
    finally:
        jobs.release()
    assert jobs._state["points"] == {}
