"""Two configs per M timed back to back on this machine and judged by ``compare``'s verdict: what ``retime`` and
``export-configs --merge-with`` measure.

{M: (a, b)} -> a bench (``workers.bench.PoolBench`` on ``workers.pools.Pools``: each config checked, then timed)
compiles both, then times both at every M ``repeats`` times, their order swapped each pass -> per M and
side the median over the passes and the noise (the spread within a pass and between passes,
``compare.point_times``) -> ``ratio = a / b`` and FASTER / SLOWER / SAME / UNKNOWN (``compare.judge`` against
``compare.combined_noise``), or FAILED where ``a`` did not run. Every timing is a row of a run folder
(``open_run``, ``row``), so ``moebench report`` and ``compare`` read it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from moebench.report.compare import combined_noise, judge, point_times
from moebench.tile import TileConfig

if TYPE_CHECKING:
    from moebench.paths.base import Target
    from moebench.problem import Problem
    from moebench.store.runfolder import RunWriter
    from moebench.workers.bench import Bench, Timed

REPEATS = 3  # passes over every pair: the spread between them is part of the noise
MIN_NOISE = 0.03  # the least noise band, as `moebench compare`'s default threshold


@dataclass(frozen=True)
class Judged:
    """One M: ``a`` against ``b``, each the median over the passes (None where it did not run, ``*_error`` says
    why), their noise band (None: unknown), and the verdict of ``a``: FASTER, SLOWER, SAME, UNKNOWN, FAILED.
    ``a_spread``: the largest spread of ``a``'s own timings, for judging it against a time from elsewhere."""

    M: int
    a: TileConfig
    b: TileConfig
    a_us: float | None
    b_us: float | None
    noise: float | None
    verdict: str
    a_spread: float | None = None
    a_error: str | None = None
    b_error: str | None = None

    @property
    def ratio(self) -> float | None:
        return self.a_us / self.b_us if self.a_us and self.b_us else None


def time_pairs(bench: Bench, pairs: Mapping[int, tuple[TileConfig, TileConfig]], phase: str,
               repeats: int = REPEATS, min_noise: float = MIN_NOISE) -> dict[int, Judged]:
    """Each M's ``(a, b)`` compiled, then timed back to back ``repeats`` times at ``phase``'s budget (the order
    swapped each pass; a config given twice is timed once), and judged (see the module docstring)."""
    if repeats < 1:
        from moebench.errors import UserError

        raise UserError(f"--repeats {repeats}: at least 1")
    configs = list({c.key(): c for pair in pairs.values() for c in pair}.values())
    failed = bench.compile(configs)
    timed: dict[tuple, list[tuple[int, Timed]]] = defaultdict(list)  # (M, config key) -> (pass, timing)
    for i in range(repeats):
        work = {}
        for M, pair in pairs.items():
            ordered = pair if i % 2 == 0 else pair[::-1]
            todo = [c for c in {c.key(): c for c in ordered}.values() if c.key() not in failed]
            if todo:
                work[M] = todo
        if not work:
            break
        for M, ts in bench.time(work, phase).items():
            for t in ts:
                timed[(M, t.config.key())].append((i, t))
    return {M: _judge(M, a, b, timed, failed, min_noise) for M, (a, b) in pairs.items()}


def _judge(M: int, a: TileConfig, b: TileConfig, timed: Mapping, failed: Mapping, min_noise: float) -> Judged:
    frames, errors = {}, {}
    for side, cfg in (("a", a), ("b", b)):
        runs = timed.get((M, cfg.key()), [])
        ok = [(i, t) for i, t in runs if t.ok and t.time_us is not None]
        if not ok:
            why = failed.get(cfg.key()) or next((t for _, t in runs if not t.ok), None)
            errors[side] = f"{why.failure}: {why.error}" if why is not None else "not timed"
            continue
        frames[side] = pd.DataFrame([{"side": side, "status": "ok", "time_us": t.time_us, "time_p20_us": t.p20_us,
                                      "time_p80_us": t.p80_us, "run": str(i)} for i, t in ok])
    times = point_times(pd.concat(list(frames.values())), ["side"]).set_index("side") if frames else None
    us = {s: float(times.loc[s, "time_us"]) for s in frames} if times is not None else {}
    spread = float(times.loc["a", "within"]) if "a" in frames and pd.notna(times.loc["a", "within"]) else None
    out = Judged(M, a, b, us.get("a"), us.get("b"), None, "FAILED", spread, errors.get("a"), errors.get("b"))
    if "a" not in frames:
        return out
    if "b" not in frames:
        return replace(out, verdict="UNKNOWN")
    if a.key() == b.key():
        return replace(out, noise=min_noise, verdict="SAME")
    sides = {s: times.loc[[s], ["within", "between"]].reset_index(drop=True) for s in ("a", "b")}
    noise = combined_noise(sides["a"], sides["b"], min_noise).iloc[0]
    verdict = judge(pd.Series([us["a"] / us["b"]]), pd.Series([noise])).iloc[0]
    return replace(out, noise=None if pd.isna(noise) else float(noise), verdict=str(verdict))


def against(now_us: float | None, spread: float | None, then: Mapping | None,
            min_noise: float = MIN_NOISE) -> tuple[float | None, str]:
    """A time measured now against one recorded elsewhere (``then``: ``time_us``, ``p20_us``, ``p80_us``):
    (now / then, the verdict of now), the band being the larger spread of the two, at least ``min_noise``."""
    if not now_us or not then or not then.get("time_us"):
        return None, "UNKNOWN"
    t, p20, p80 = then.get("time_us"), then.get("p20_us"), then.get("p80_us")
    then_spread = (p80 - p20) / t if p20 is not None and p80 is not None else None
    if spread is None or then_spread is None:
        return now_us / t, "UNKNOWN"
    noise = max(spread, then_spread, min_noise)
    return now_us / t, str(judge(pd.Series([now_us / t]), pd.Series([noise])).iloc[0])


# ---- where the timings run and go ----------------------------------------------------------------------

def open_run(out_base: Path, name: str, interpreter: bool, **entries) -> RunWriter:
    """A new run folder ``<time>-<name>`` under ``out_base`` for timings of this kind, ``entries`` in its meta."""
    from moebench.environment import describe
    from moebench.measure.timer import run_method
    from moebench.store.runfolder import RunWriter, ensure_out_dir, new_run_dir

    meta = describe(interpreter)
    meta.update(sweep=name, timing_method=run_method(interpreter), **entries)
    ensure_out_dir(out_base)
    return RunWriter(new_run_dir(out_base, name), meta)


def row(problem: Problem, path: str, target: Target, t: Timed, source: str | None) -> dict:
    """The run folder's row of one timing ``t``, as a sweep's rows are (no tune phase: ``report`` shows the
    fastest config of each point, ``compare`` and ``export-configs`` read it as any run); ``source`` says where
    the config came from (``config_source``: a table's entry, or the path's "heuristic" default)."""
    from moebench.workers.bench import timed_row

    return timed_row(problem, path, target, t, phase=None, source=source)
