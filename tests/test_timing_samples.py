"""A ``Timing`` built from samples: the time it reports is the median sample, its spread the 20th and 80th
percentiles, and a timer (the wall clock, on a clock the test drives) reports what it computes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from moebench.measure import timer
from moebench.measure.timer import Timing

# (samples in microseconds, their median worked out by hand)
CASES = [
    ([30.0, 10.0, 20.0], 20.0),  # odd count: the middle sample, whatever the order they came in
    ([5.0, 1.0, 9.0, 3.0, 100.0], 5.0),  # one outlier (a preempted replay): the median ignores it, a mean would not
    ([4.0, 1.0, 3.0, 2.0], 2.5),  # even count: halfway between the two middle samples
    ([7.0, 7.0, 7.0, 1.0], 7.0),  # one fast sample: the minimum (1.0) is not the typical time
    ([42.0], 42.0),  # one sample: it is the median and both percentiles
]


@pytest.mark.parametrize("samples, median", CASES)
def test_a_timing_reports_the_median_sample(samples, median):
    """``median_us`` is the middle of the sorted samples, not the fastest; the percentiles bracket it;
    ``reps`` counts the samples."""
    if len(samples) > 1:
        assert median != min(samples)  # the case tells the median from the minimum
    t = Timing.from_samples(samples, "test")
    assert t.median_us == pytest.approx(median)
    assert min(samples) <= t.p20_us <= t.median_us <= t.p80_us <= max(samples)
    assert t.reps == len(samples) and t.method == "test"


@pytest.mark.parametrize("durations_us, median", [
    ([30.0, 10.0, 80.0], 30.0),  # fastest 10, mean 40
    ([40.0, 10.0, 90.0, 20.0, 60.0], 40.0),  # fastest 10, mean 44
])
def test_the_wall_clock_timer_reports_the_median_of_its_timed_calls(monkeypatch, durations_us, median):
    """``time_wallclock`` calls ``fn`` once untimed, then times ``reps`` calls; on a clock that advances by the
    given durations over the timed calls it reports their median."""
    now = [0.0]
    steps = iter([1000.0, *durations_us])  # the first call is the untimed warm-up

    def fn() -> None:
        now[0] += next(steps) * 1e-6

    monkeypatch.setattr(timer, "time", SimpleNamespace(perf_counter=lambda: now[0]))  # the timer's clock only
    t = timer.time_wallclock(fn, reps=len(durations_us))
    assert t.median_us == pytest.approx(median)
    assert t.reps == len(durations_us) and t.method == timer.WALLCLOCK
