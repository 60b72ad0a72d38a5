"""The timer: CUDA-graph replay with a cold L2, median and spread.

``time_graph`` is the honest default for GPU paths: the closure is captured
once in a CUDA graph (no CPU launch gaps between its kernels), and before each
replay a buffer several times the L2 is overwritten so the weights are read
from HBM, as they are when a serving engine steps through many layers. Each
replay is bracketed by its own events; the flush runs before the start event
and keeps the GPU busy while the host enqueues the replay.

Paths that synchronize with the host (the torch reference) use
``time_eager``; the Triton interpreter on the CPU uses ``time_wallclock``, and
its numbers say nothing about GPU performance.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

GRAPH = "cuda-graph replay, L2 flushed before each replay, median"
EAGER = "eager launches, per-call CUDA events, L2 flushed, median"
WALLCLOCK = "cpu wall clock under the Triton interpreter (correctness only, not GPU performance)"


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float
    reps: int
    method: str

    @classmethod
    def from_samples(cls, samples_us: list[float], method: str) -> Timing:
        s = sorted(samples_us)
        q = statistics.quantiles(s, n=5, method="inclusive") if len(s) > 1 else [s[0]] * 4
        return cls(statistics.median(s), q[0], q[3], len(s), method)


def _flush_buffer(device: torch.device) -> torch.Tensor:
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return torch.empty(max(256 << 20, 4 * l2), dtype=torch.uint8, device=device)


def _reps_for(estimate_us: float, budget_s: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(budget_s * 1e6 / max(estimate_us, 1.0))))


def time_graph(fn: Callable[[], None], *, budget_s: float = 0.3, min_reps: int = 20, max_reps: int = 200,
               warmup: int = 3) -> Timing:
    """Median time of one replay of ``fn`` captured in a CUDA graph, with a cold L2."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):  # compiles kernels, sizes allocations
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _time_replays(graph.replay, budget_s, min_reps, max_reps, GRAPH)


def time_eager(fn: Callable[[], None], *, budget_s: float = 0.3, min_reps: int = 5, max_reps: int = 50,
               warmup: int = 1) -> Timing:
    """Median time of eager calls of ``fn`` (for closures that synchronize with the host)."""
    for _ in range(warmup):
        fn()
    return _time_replays(fn, budget_s, min_reps, max_reps, EAGER)


def _time_replays(launch: Callable[[], None], budget_s: float, min_reps: int, max_reps: int,
                  method: str) -> Timing:
    device = torch.device("cuda", torch.cuda.current_device())
    flush = _flush_buffer(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once() -> float:
        flush.zero_()
        start.record()
        launch()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3

    reps = _reps_for(once(), budget_s, min_reps, max_reps)
    samples = [once() for _ in range(reps)]
    return Timing.from_samples(samples, method)


def time_wallclock(fn: Callable[[], None], *, reps: int = 3) -> Timing:
    """Wall-clock time on the CPU (Triton interpreter runs): correctness runs, not performance."""
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return Timing.from_samples(samples, WALLCLOCK)
