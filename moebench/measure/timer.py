"""The timer: CUDA-graph replay with a cold L2, median and spread.

``time_graph`` is the honest default for GPU paths: the closure is captured
once in a CUDA graph (no CPU launch gaps between its kernels), and before each
replay a buffer four times the L2 is read, so the timed code finds none of its
data in L2 and reads its weights from HBM, as a serving engine does when it
steps through many layers. Each replay is bracketed by its own events; the
flush runs before the start event and keeps the GPU busy while the host
enqueues the replay.

The flush reads; it does not write. A zero fill (``flush="zero"``, kept to
compare with runs timed that way) leaves L2 full of dirty lines, which the
timed kernels' reads then evict, writing them back to HBM while they read:
work of the flush's, billed to the timed code.

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

from moebench.kernels.stream import read_all

# How L2 is emptied before each timed call (the ``flush`` argument): "read" (a buffer 4x the L2 read
# through), or "zero" (the same buffer zero-filled).
FLUSH_MODES = {"read": "a read of 4x its size", "zero": "a zero fill of 4x its size"}
WALLCLOCK = "cpu wall clock under the Triton interpreter (correctness only, not GPU performance)"


def _flush_text(mode: str) -> str:
    try:
        return FLUSH_MODES[mode]
    except KeyError:
        raise ValueError(f"unknown L2 flush {mode!r}; known: {', '.join(FLUSH_MODES)}") from None


def graph_method(flush: str = "read") -> str:
    """The timing method of ``time_graph`` as rows and run metadata name it."""
    return f"cuda-graph replay, L2 emptied before each replay ({_flush_text(flush)}), median"


def run_method(interpreter: bool) -> str:
    """The timing method a run's rows and metadata name: ``graph_method()`` on a GPU, ``WALLCLOCK`` on the
    interpreter (the one spelling of each; a worker's timings are ``time_graph``'s with the read flush)."""
    return WALLCLOCK if interpreter else graph_method()


def eager_method(flush: str = "read") -> str:
    """The timing method of ``time_eager`` as rows name it."""
    return f"eager launches, per-call CUDA events, L2 emptied ({_flush_text(flush)}), median"


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


class L2Flush:
    """Empties L2 when called, as ``mode`` says: "read" reads ``buf`` through (its sums into ``partial``),
    "zero" zero-fills it."""

    def __init__(self, nbytes: int, programs: int, device: torch.device | str, mode: str = "read") -> None:
        _flush_text(mode)
        self.mode = mode
        self.buf = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)  # [nbytes / 2], filled once
        read = mode == "read"
        self.partial = torch.empty(programs, dtype=torch.float32, device=device) if read else None  # [programs]

    def __call__(self) -> None:
        if self.partial is None:
            self.buf.zero_()
        else:
            read_all(self.buf, self.partial)


def device_flush(device: torch.device, mode: str = "read") -> L2Flush:
    """An ``L2Flush`` of 4x the device's L2 (at least 256 MiB), 8 programs per SM reading it."""
    props = torch.cuda.get_device_properties(device)
    return L2Flush(max(256 << 20, 4 * props.L2_cache_size), 8 * props.multi_processor_count, device, mode)


def _reps_for(estimate_us: float, budget_s: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(budget_s * 1e6 / max(estimate_us, 1.0))))


def time_graph(fn: Callable[[], None], *, budget_s: float = 0.3, min_reps: int = 20, max_reps: int = 200,
               warmup: int = 3, flush: str = "read") -> Timing:
    """Median time of one replay of ``fn`` captured in a CUDA graph, with a cold L2 (the device's
    ``L2Flush`` of mode ``flush`` empties it before each replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):  # compiles kernels, sizes allocations
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _time_replays(graph.replay, budget_s, min_reps, max_reps, graph_method(flush), flush)


def time_eager(fn: Callable[[], None], *, budget_s: float = 0.3, min_reps: int = 5, max_reps: int = 50,
               warmup: int = 1, flush: str = "read") -> Timing:
    """Median time of eager calls of ``fn`` (for closures that synchronize with the host), L2 emptied as
    ``flush`` says before each."""
    for _ in range(warmup):
        fn()
    return _time_replays(fn, budget_s, min_reps, max_reps, eager_method(flush), flush)


def _time_replays(launch: Callable[[], None], budget_s: float, min_reps: int, max_reps: int,
                  method: str, mode: str) -> Timing:
    flush = device_flush(torch.device("cuda", torch.cuda.current_device()), mode)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once() -> float:
        flush()
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
