"""``moebench fit-time``: the points of ``fit-check --points`` timed on this GPU: the fitted default against the
engines' untuned default and the tuned table, back to back.

points file -> per served entry: moebench's kernel (``triton``) times the fitted config and the table's (the
heuristic where the shape has no table), the engines' form (``triton-classic``) its untuned default, a bench
each (``workers.pools.Pools``), each config checked against the reference first -> ``repeats`` passes, the two
benches' order and the two configs' swapped each pass -> per M and side the median and the noise
(``compare.point_times``, ``combined_noise``) -> the fitted config judged against each (``compare.judge``) ->
``meets``: not SLOWER than the engines' default and at most ``GOAL_VS_TABLE`` times the table's time; per entry
``shape_goals``: the goal as the issue states it (never SLOWER than the engines' default, within
``GOAL_VS_TABLE`` of the table by the geometric mean). Every timing is a row of a run folder, its
``config_source`` saying which of the three it is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from moebench.audit.fitcheck import POINTS_FORMAT, POINTS_VERSION
from moebench.audit.pairs import MIN_NOISE, REPEATS, open_run, row
from moebench.bounded import Refused, read_json
from moebench.errors import UserError
from moebench.tile import TileConfig

if TYPE_CHECKING:
    from moebench.workers.pools import Pools

GOAL_VS_TABLE = 1.10  # the fitted default's time at most this times the tuned table's
SIDES = ("fitted", "other", "classic")  # other: the table's config, or the heuristic where there is no table


def read_points(path: Path | str, notes: list[str] | None = None) -> list[dict]:
    """The points of a ``fit-check --points`` file; UserError (one line) for another file or version, a note
    where the file is newer than this moebench."""
    try:
        raw = read_json(path, gz=False)
    except Refused as e:
        raise UserError(f"{path}: cannot read points ({e.why})") from None
    if not isinstance(raw, dict) or raw.get("format") != POINTS_FORMAT or not isinstance(raw.get("points"), list):
        raise UserError(f"{path}: not a {POINTS_FORMAT} file (moebench fit-check --points writes one)")
    version = raw.get("version")
    if not isinstance(version, int) or version < 1:
        raise UserError(f"{path}: {POINTS_FORMAT} version {version!r} is not one this moebench reads")
    if version > POINTS_VERSION and notes is not None:
        notes.append(f"warning: {path} is {POINTS_FORMAT} version {version}, this moebench reads {POINTS_VERSION}")
    return raw["points"]


@dataclass(frozen=True)
class Timing:
    """One point: the three sides' median times (None where one did not run), the fitted config's ratio to each
    other side and its verdict (FASTER, SLOWER, SAME, UNKNOWN), and what ``other`` was (table or heuristic)."""

    point: dict
    us: dict[str, float | None]
    vs_classic: float | None
    classic_verdict: str
    vs_other: float | None
    other_verdict: str
    other: str  # "table" or "heuristic"
    errors: tuple[str, ...] = ()

    @property
    def meets(self) -> bool:
        """The goal: not SLOWER than the engines' default, and within ``GOAL_VS_TABLE`` of the table's time."""
        if self.vs_classic is None or self.classic_verdict == "SLOWER":
            return False
        return self.other != "table" or (self.vs_other is not None and self.vs_other <= GOAL_VS_TABLE)


@dataclass(frozen=True)
class ShapeGoal:
    """One entry's points against the goal of issue 47: at every point not SLOWER than the engines' default (nor
    failed), and where the shape has a table, within ``GOAL_VS_TABLE`` of it by the geometric mean over its
    points."""

    model: str
    tp: int
    dtype: str
    points: int
    behind_classic: tuple[int, ...]  # the M where the fitted default was SLOWER than the engines' default or failed
    vs_table: float | None  # geometric mean of fitted / table over the points both ran (None: no table)

    @property
    def meets(self) -> bool:
        return not self.behind_classic and (self.vs_table is None or self.vs_table <= GOAL_VS_TABLE)


def shape_goals(timings: Sequence[Timing]) -> list[ShapeGoal]:
    """Per served entry (model, TP, dtype), in the order the points came: ``ShapeGoal``."""
    import math

    by: dict[tuple, list[Timing]] = defaultdict(list)
    for t in timings:
        by[(t.point["model"], t.point["tp"], t.point["dtype"])].append(t)
    out = []
    for (model, tp, dtype), ts in by.items():
        behind = tuple(t.point["M"] for t in ts if t.vs_classic is None or t.classic_verdict == "SLOWER")
        ratios = [t.vs_other for t in ts if t.other == "table" and t.vs_other]
        mean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
        out.append(ShapeGoal(model, tp, dtype, len(ts), behind, mean))
    return out


@dataclass
class FitTimes:
    run_dir: Path
    timings: list[Timing] = field(default_factory=list)


def entry_name(model: str, tp: int) -> str:
    """A served entry's model as the presets name it sharded: ``model@tpN`` above TP 1."""
    return f"{model}@tp{tp}" if tp > 1 else model


def _entry(p: dict) -> tuple:
    return p["model"], p["tp"], p["dtype"], p["experts"], p["intermediate"], p["hidden"], p["topk"]


def time_points(pts: Sequence[dict], out_base: Path, pools: Pools, repeats: int = REPEATS,
                on_progress: Callable[[str, int, int], None] | None = None) -> FitTimes:
    """Time every point of ``pts`` (see the module docstring) into a new run folder under ``out_base``."""
    from moebench.models import explicit_shape
    from moebench.paths.base import Target
    from moebench.problem import Problem

    if repeats < 1:
        raise UserError(f"--repeats {repeats}: at least 1")
    target = Target.current()
    writer = open_run(out_base, "fit-time", target.interpreter, fit_time={"points": len(pts), "repeats": repeats})
    result = FitTimes(writer.run_dir)
    by_entry: dict[tuple, list[dict]] = defaultdict(list)
    for p in pts:
        by_entry[_entry(p)].append(p)
    with writer:
        for (model, tp, dtype, E, I, H, topk), group in by_entry.items():
            shape = explicit_shape(E, H, I, topk, name=entry_name(model, tp))
            problems = {p["M"]: Problem(shape, p["M"], dtype) for p in group}
            configs = {p["M"]: _sides(p) for p in group}
            source = {(kernel, M, cfg.key()): label for M, sides in configs.items()
                      for side, (cfg, kernel, label) in sides.items()}

            def record(t, kernel: str, problems=problems, source=source) -> None:
                writer.append(row(problems[t.M], kernel, target, t, source.get((kernel, t.M, t.config.key()))))

            benches = {kernel: pools.bench(kernel, problems, lambda t, k=kernel: record(t, k), on_progress)
                       for kernel in ("triton", "triton-classic")}
            runs = _time(benches, configs, repeats)
            result.timings += [_judged(p, configs[p["M"]], runs) for p in group]
    return result


def _sides(p: dict) -> dict[str, tuple[TileConfig, str, str]]:
    """side -> (config, the path that runs it, its config_source)."""
    other = ("table", p["table"], f"table:{p['table_from']}") if p.get("table") else \
        ("heuristic", p["heuristic"], "heuristic")
    return {"fitted": (TileConfig.from_dict(p["fitted"]), "triton", p["fitted_from"]),
            "other": (TileConfig.from_dict(other[1]), "triton", other[2]),
            "classic": (TileConfig.from_dict(p["classic"]), "triton-classic", "classic default")}


def _time(benches: dict, configs: dict[int, dict], repeats: int) -> dict[tuple[str, int], list[tuple[int, object]]]:
    """(kernel, M, config key) -> [(pass, Timed)]: each kernel's configs compiled on its bench, then timed
    ``repeats`` times, the benches' order and each M's configs' order swapped each pass (a config asked for
    twice is timed once). A config that failed to compile is there once, as its failure."""
    runs: dict[tuple, list] = defaultdict(list)
    for kernel, bench in benches.items():
        todo = {cfg.key(): cfg for sides in configs.values() for cfg, k, _ in sides.values() if k == kernel}
        for key, failed in bench.compile(list(todo.values())).items():
            for M in configs:
                runs[(kernel, M, key)].append((-1, failed))
    for i in range(repeats):
        for kernel in (list(benches) if i % 2 == 0 else list(benches)[::-1]):
            work = {}
            for M, sides in configs.items():
                cfgs = [cfg for cfg, k, _ in sides.values() if k == kernel]
                cfgs = {c.key(): c for c in (cfgs if i % 2 == 0 else cfgs[::-1])
                        if not any(p < 0 for p, _ in runs.get((kernel, M, c.key()), []))}
                if cfgs:
                    work[M] = list(cfgs.values())
            if not work:
                continue
            for M, timed in benches[kernel].time(work, "final").items():
                for t in timed:
                    runs[(kernel, M, t.config.key())].append((i, t))
    return runs


def _judged(p: dict, sides: dict, runs: dict) -> Timing:
    import pandas as pd

    from moebench.report.compare import combined_noise, judge, point_times

    frames, us, errors = {}, {}, []
    for side, (cfg, kernel, _) in sides.items():
        ok = [(i, t) for i, t in runs.get((kernel, p["M"], cfg.key()), []) if t.ok and t.time_us is not None]
        if not ok:
            why = next((t for _, t in runs.get((kernel, p["M"], cfg.key()), []) if not t.ok), None)
            errors.append(f"{side}: {why.failure}: {why.error}" if why else f"{side}: not timed")
            us[side] = None
            continue
        frames[side] = point_times(pd.DataFrame([{"side": side, "status": "ok", "time_us": t.time_us,
                                                   "time_p20_us": t.p20_us, "time_p80_us": t.p80_us, "run": str(i)}
                                                  for i, t in ok]), ["side"]).reset_index(drop=True)
        us[side] = float(frames[side]["time_us"].iloc[0])

    def against(side: str) -> tuple[float | None, str]:
        if us["fitted"] is None or us[side] is None:
            return None, "FAILED" if us["fitted"] is None else "UNKNOWN"
        r = us["fitted"] / us[side]
        if side == "other" and sides["fitted"][0].key() == sides["other"][0].key():
            return r, "SAME"
        noise = combined_noise(frames["fitted"], frames[side], MIN_NOISE)
        return r, str(judge(pd.Series([r]), noise).iloc[0])

    (vs_classic, cv), (vs_other, ov) = against("classic"), against("other")
    return Timing(p, us, vs_classic, cv, vs_other, ov, "table" if p.get("table") else "heuristic", tuple(errors))
