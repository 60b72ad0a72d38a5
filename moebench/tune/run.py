"""A tune: one kernel, one shape and dtype, many M; a run folder with a row per measurement, and the best
table.

``tune`` checks everything first (``check``: the request, options, pool choice, ``--check-against`` run and
``--out`` names; nothing is created until it passes), opens a run folder (or reopens the one an interrupted
start of the same request left: ``store.resume.find_resumable``), builds each M's pruned and ranked candidates
and known seeds, starts the worker pools and hands them to the strategy. Each measurement is a row as it
arrives (failures too, typed). The chosen config of each M is then re-timed back to back with the path's
untuned default and with the fastest-screened known seed that is not the default (for moebench's kernel, the
best hand-picked candidate) ("default" rows), so the table's gain over both is measured in the same run, and
the table is written into the folder. An M where nothing was chosen fails the run (``NothingChosen``).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from moebench.dtypes import get_dtype
from moebench.environment import describe
from moebench.errors import UserError
from moebench.hardware import DeviceLimits
from moebench.measure.failures import out_of_memory
from moebench.measure.timer import run_method
from moebench.models import MoEShape
from moebench.paths.base import Target
from moebench.paths.registry import get_path
from moebench.problem import Problem, check_fits
from moebench.space.declared import VLLM_MS, get_space
from moebench.space.prune import OWN_RULES, OWN_RUNNABLE, RULES, Facts
from moebench.store.best import BEST_FILE, BestFileError, read_best, write_best
from moebench.store.resume import find_resumable, request_key, stop_on_sigterm, stopped_in
from moebench.store.runfolder import RunWriter, ensure_out_dir, new_run_dir
from moebench.tile import TileConfig
from moebench.tune.candidates import Candidates
from moebench.tune.seeds import known_seeds
from moebench.tune.strategies import DEFAULT, get_strategy
from moebench.tune.traffic import under_traffic
from moebench.workers.bench import Kept, PoolBench, Timed, timed_row
from moebench.workers.jobs import BUDGETS
from moebench.workers.pools import Pools

OUT_OF_MEMORY = "out of GPU memory"  # how a tune counts a "resources" failure that was CUDA's memory running out
CHECK_PASSES = 2  # back-to-back passes over (choice, default, known) at the end of a tune


@dataclass(frozen=True)
class TuneRequest:
    """What a tune is asked to do; its ``key`` names it, so the same request resumes the same folder."""

    shape: MoEShape
    dtype: str
    path: str = "triton-classic"
    ms: tuple[int, ...] = VLLM_MS
    strategy: str = DEFAULT
    options: tuple[tuple[str, int], ...] = ()  # the strategy's options given, (name, value)
    routing: str = "uniform"  # a routing.ROUTINGS name, or a captured file's (routing.captured)
    seed: int = 0
    prune: bool = True
    m_weights: tuple[tuple[int, float], ...] = ()  # served batch token counts and their weights (tune.traffic)

    @property
    def key(self) -> str:
        return request_key({**asdict(self), "shape": asdict(self.shape)})

    def problem(self, M: int) -> Problem:
        return Problem(self.shape, M, self.dtype, self.routing, self.seed)


@dataclass
class TuneResult:
    run_dir: Path
    best: dict[int, Timed | None]  # per M: the chosen config, re-timed beside the default
    default: dict[int, Timed | None] = field(default_factory=dict)  # per M: the untuned config's
    known: dict[int, Timed | None] = field(default_factory=dict)  # per M: the best known seed's (hand-picked)
    traffic: dict | None = None  # under --m-weights: the expected time per batch, tuned and default
    check: dict[int, tuple[Timed | None, Timed | None]] = field(default_factory=dict)  # per M: (ours, theirs)
    resumed: dict | None = None


def _options(request: TuneRequest):
    module = get_strategy(request.strategy)
    defaults = getattr(module, "PATH_DEFAULTS", {}).get(request.path, {})  # the path's own defaults, if any
    try:
        return module.Options(**{**defaults, **dict(request.options)})
    except TypeError:
        known = ", ".join(module.Options.__dataclass_fields__)
        raise UserError(f"strategy {request.strategy!r} takes options: {known}") from None


def _row(request: TuneRequest, target: Target, t: Timed) -> dict:
    return timed_row(request.problem(t.M), request.path, target, t, phase=t.phase)


def _timed(row: dict) -> Timed:
    return Timed(TileConfig.from_dict(row["config"]), int(row["M"]), row.get("phase"), row.get("time_us"),
                 row.get("time_p20_us"), row.get("time_p80_us"), row.get("reps"), row.get("rel_err"),
                 row.get("failure"), row.get("error"))


@dataclass(frozen=True)
class Checked:
    """A request found runnable by ``check``: what ``tune`` builds from, nothing created yet."""

    target: Target
    path: object  # the MoEPath
    space: object  # its search space
    options: object  # the strategy's Options
    other: dict[int, TileConfig]  # --check-against's choices by M
    problems: dict[int, Problem]
    name: str  # the run folder's name after its time stamp


def check(request: TuneRequest, out_base: Path, *, gpus: int | None = None, ray: str | bool | None = None,
          check_against: Path | None = None) -> Checked:
    """Every check of a tune before it creates anything: the request (path, M, dtype, the path's support here),
    the strategy's options, the pool choice, the ``--check-against`` run and the names under ``out_base``;
    UserError (one line) for the first that fails."""
    from moebench.workers.pools import check_pool_choice

    target = Target.current()
    path = get_path(request.path)
    space = get_space(request.path)
    if not request.ms or min(request.ms) < 1:
        raise UserError("--m needs positive token counts")
    options = _options(request)
    problems = {M: request.problem(M) for M in sorted(set(request.ms))}
    get_dtype(request.dtype)
    check_fits(problems.values(), target.device)  # the timing workers build the float32 reference too
    reason = path.supports(problems[min(problems)], target)
    if reason:
        raise UserError(f"path {request.path!r} cannot run {request.shape.name} {request.dtype} here: {reason}")
    check_pool_choice(gpus, ray)
    other = _other_choices(check_against, request) if check_against else {}
    name = f"tune-{request.shape.name}-{request.dtype}".replace("@", "-")  # "@" is a poor file-name character
    _check_out_names(Path(out_base), name)
    return Checked(target, path, space, options, other, problems, name)


def _check_out_names(out_base: Path, name: str) -> None:
    """UserError where ``out_base``, or a run folder named ``name`` in it, has a name the file system refuses."""
    full = out_base.absolute() / f"{'0' * 15}-{name}-99" / "rows.jsonl"  # new_run_dir's longest name
    existing = next(p for p in full.parents if p.exists())
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in full.parts:
        if len(os.fsencode(part)) > name_max:
            raise UserError(f"--out {out_base}: the name {part[:24]}... is too long for the file system "
                            f"({len(os.fsencode(part))} bytes; at most {name_max})")
    if len(os.fsencode(str(full))) >= path_max:
        raise UserError(f"--out {out_base}: too long for the file system with a run folder in it "
                        f"(at most {path_max} bytes in all)")


class NothingChosen(UserError):
    """A tune that ran through but chose no config at some M: the run is recorded "failed" with this line, and
    ``result`` holds what it did choose. A UserError, so a caller that tunes many tables (``tune.served``) takes
    it as that table's error; ``moebench tune`` shows the table, then this line, and exits 1."""

    def __init__(self, line: str, result: TuneResult):
        super().__init__(line)
        self.result = result


def tune(request: TuneRequest, out_base: Path, *, gpus: int | None = None, ray: str | bool | None = None,
         compile_jobs: int | None = None, fresh: bool = False, check_against: Path | None = None,
         on_progress: Callable[[str, int, int], None] | None = None,
         on_result: Callable[[Timed], None] | None = None) -> TuneResult:
    """Run ``request`` (see the module docstring); the run folder and the chosen configs. ``check`` runs first,
    then ``out_base`` is created. An M where nothing was chosen fails the run: ``NothingChosen`` says where and
    why, and meta.json records it."""
    ok = check(request, out_base, gpus=gpus, ray=ray, check_against=check_against)
    target, path, problems = ok.target, ok.path, ok.problems
    limits = DeviceLimits.current()
    facts = {M: Facts.of(p, request.path, limits) for M, p in problems.items()}
    cands = Candidates(ok.space, facts, rules=RULES if request.prune else RULES[:1],
                       seeds=known_seeds(path, problems, limits),
                       own_rules=OWN_RULES if request.prune else OWN_RUNNABLE)
    meta = describe(target.interpreter)
    meta.update(sweep=ok.name, tune=True, request=request.key,
                tuning={"path": request.path, "model": request.shape.name, "dtype": request.dtype,
                        "ms": list(problems), "strategy": request.strategy, "options": asdict(ok.options),
                        "prune": request.prune, "space": ok.space.describe(), "space_size": ok.space.size,
                        "budgets": BUDGETS, "routing": request.routing, "seed": request.seed,
                        "limits": asdict(limits)},  # what the rules and seeds read of the device, for replays
                timing_method=run_method(target.interpreter))
    ensure_out_dir(out_base)
    resumable = None if fresh else find_resumable(out_base, request.key)
    writer = (RunWriter(resumable, meta, resume=True) if resumable
              else RunWriter(new_run_dir(out_base, meta["sweep"]), meta))
    kept = Kept([_timed(r) for r in writer.kept if r.get("path") == request.path and r.get("config")])
    started, stopped = time.monotonic(), None
    result = TuneResult(writer.run_dir, {}, resumed=writer.resumed)
    failed = {M: Counter() for M in problems}  # per M: its failures by type (a first run's count at every M)

    def count(t: Timed) -> None:
        if not t.ok:
            for M in (problems if t.phase is None else (t.M,)):
                if M in failed:
                    failed[M][OUT_OF_MEMORY if out_of_memory(t.failure, t.error) else t.failure] += 1

    known_keys = {M: {c.key() for c in cands.seeds(M)} - {path.default_config(p).key()} for M, p in problems.items()}
    known: dict[int, Timed] = {}  # per M: the fastest screen of a known seed other than the default

    def note_known(t: Timed) -> None:
        if t.phase == "screen" and t.ok and t.time_us is not None and t.config.key() in known_keys.get(t.M, ()):
            if t.M not in known or t.time_us < known[t.M].time_us:
                known[t.M] = t

    def record(t: Timed) -> None:
        writer.append(_row(request, target, t))
        count(t)
        note_known(t)
        if on_result:
            on_result(t)

    for r in writer.kept:
        if r.get("path") == request.path and r.get("config"):
            count(_timed(r))
            note_known(_timed(r))
    pools, bench = Pools(gpus, compile_jobs, ray), None
    try:
        with stop_on_sigterm():
            bench = pools.bench(request.path, problems, record, on_progress, kept)
            chosen = get_strategy(request.strategy).search(cands, bench, ok.options)
            result.best, result.default, result.known = _against_default(
                bench, path, problems, chosen, {M: t.config for M, t in known.items()})
            result.check = _against_other(bench, chosen, ok.other)
            result.traffic = under_traffic(dict(request.m_weights), *(
                {M: t.time_us if t and t.ok else None for M, t in side.items()} for side in (result.best,
                                                                                             result.default)))
            _write_best(writer.run_dir, request, result)
            missing = _nothing_chosen(chosen, result.best, failed)
            if missing:
                raise NothingChosen(missing, result)
    except BaseException as e:
        stopped = stopped_in(e, writer.run_dir)
        if stopped is e:
            raise
        raise stopped from e
    finally:
        pools.close()
        writer.end(stopped, wall_s=round(time.monotonic() - started, 1), split=bench.split() if bench else {},
                   pruned={str(M): d for M, d in cands.dropped.items()})
    return result


def _nothing_chosen(chosen: dict, best: dict, failed: dict[int, Counter]) -> str | None:
    """The one line for the M where no config was chosen (or the choice failed its re-timing), and why; None
    where every M has a choice timed. Where GPU memory ran out, it says so and what leaves more."""
    why: dict[str, list[int]] = {}
    for M in sorted(failed):
        if chosen.get(M) is None:
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(failed[M].items()))
            reason = f"every config failed ({kinds})" if kinds else "no config was timed"
        elif best.get(M) is None or not best[M].ok:
            reason = f"the chosen config failed its re-timing ({best[M].failure if best.get(M) else 'not timed'})"
        else:
            continue
        why.setdefault(reason, []).append(M)
    if not why:
        return None
    hint = ("; the GPU ran out of memory: fewer compile workers (--compile-jobs) leave more of it to the timing"
            if any(OUT_OF_MEMORY in r for r in why) else "")
    return "no config chosen at " + "; ".join(f"M={','.join(map(str, ms))}: {r}" for r, ms in why.items()) + hint


def _against_default(bench: PoolBench, path, problems, chosen, known: dict[int, TileConfig]) -> tuple[dict, ...]:
    """Each M's chosen config, the path's default and the best known seed (where there is one), timed back to
    back at the final budget, ``CHECK_PASSES`` times over: (chosen, default, known) by M, each config's
    fastest pass (one slow outlier timing cannot decide the verdict; the table's pick reads the same rows)."""
    defaults = {M: path.default_config(p) for M, p in problems.items()}
    bench.compile(list(defaults.values()))
    trio = {M: (chosen.get(M), defaults[M], known.get(M)) for M in problems}
    work = {M: list({c.key(): c for c in cs if c is not None}.values()) for M, cs in trio.items()}  # once each
    best: dict[tuple, object] = {}
    for _ in range(CHECK_PASSES):
        for M, ts in bench.time(work, "default").items():
            for t in ts:
                have = best.get((M, t.config.key()))
                if have is None or (t.ok and (not have.ok or t.time_us < have.time_us)):
                    best[(M, t.config.key())] = t
    out: tuple[dict, dict, dict] = ({}, {}, {})
    for M in problems:
        for i, c in enumerate(trio[M]):
            out[i][M] = best.get((M, c.key())) if c is not None else None
    return out


def _other_choices(run_dir: Path, request: TuneRequest) -> dict[int, TileConfig]:
    """The configs another tune of the same kernel, shape and dtype chose (its ``best.json``), by M."""
    try:
        best = read_best(run_dir)
    except BestFileError as e:
        raise UserError(f"--check-against {run_dir}: {e}") from None
    theirs = (best.get("kernel"), best["shape"].get("name"), best.get("dtype"))
    ours = (request.path, request.shape.name, request.dtype)
    if theirs != ours:
        raise UserError(f"--check-against {run_dir}: it tuned {' '.join(map(str, theirs))}, this {' '.join(ours)}")
    out = {}
    for M, v in best["configs"].items():
        try:
            if v.get("config"):
                out[M] = TileConfig.from_dict(v["config"])
        except (AttributeError, TypeError, ValueError, UserError) as e:
            raise UserError(f"--check-against {run_dir}: {BEST_FILE} entry {M} is not a config ({e})") from None
    return out


def _against_other(bench: PoolBench, chosen: dict, other: dict) -> dict:
    """At each M both runs tuned: this run's choice and the other's, compiled and timed back to back."""
    common = {M: (chosen[M], other[M]) for M in bench.ms if M in other and chosen.get(M)}
    if not common:
        return {}
    bench.compile([c for pair in common.values() for c in pair])
    timed = bench.time({M: list({c.key(): c for c in pair}.values()) for M, pair in common.items()}, "check")
    out = {}
    for M, (ours, theirs) in common.items():
        by_key = {t.config.key(): t for t in timed.get(M, [])}
        out[M] = (by_key.get(ours.key()), by_key.get(theirs.key()))
    return out


def _write_best(run_dir: Path, request: TuneRequest, result: TuneResult) -> None:
    """The chosen config per M, its time, the default's and the best known seed's (re-timed back to back), as
    ``best.json`` in the run folder (``store.best``)."""
    def side(t: Timed | None, name: str, time_name: str | None = None) -> dict:
        return {name: t.config.as_dict() if t else None, time_name or f"{name}_us": t.time_us if t else None}

    configs = {M: {**side(t, "config", "time_us"), **side(result.default.get(M), "default"),
                   **side(result.known.get(M), "known")} for M, t in result.best.items()}
    check = {M: {"config_us": o.time_us if o else None, **side(t, "other")} for M, (o, t) in result.check.items()}
    write_best(run_dir, kernel=request.path, model=request.shape.name, shape=asdict(request.shape),
               dtype=request.dtype, configs=configs, check=check, traffic=result.traffic)
