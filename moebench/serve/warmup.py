"""Compile every launch the triton path makes for 1..N tokens ahead of serving, in worker processes, into
Triton's on-disk cache.

A plan (``WarmupPlan``) is what the triton path would run at every M of 1..``max_tokens``: the config of a
table file given directly (``plan_for_table``), or of the table the lookup picks for a shape
(``plan_for_model``: --configs, env, shipped), at its key nearest M (``ConfigTable.nearest_key``, as the lookup
reads it); where there is no table, what the lookup runs at each M (the fitted default, else the heuristic
config). ``warm`` first-runs each kept (M, config) once on every shape of the plan in
``precompile.Precompiler``'s workers, which compile the kernels into ``TRITON_CACHE_DIR``; a later process finds
them there and loads them instead of compiling. It counts the kernels the cache gained (``kernel_entries``) and
lists the configs that could not run, without stopping.

Two pairs of one config at different M are "the same launch" when ``launch_key`` is equal: the config and
every flag of ``fused_moe.launch_plan`` but the grid sizes and token counts (the kernels take those as
``do_not_specialize`` arguments), and the align step's kernel (one program up to ``ONE_PROGRAM_SLOTS``
slots). Such a pair compiles nothing the first did not, so only the first M of each key is kept; an M where
the config or a flag changes (e.g. who zeroes the top-k sums) starts a key of its own.

On the Triton interpreter nothing is compiled: ``warm`` still runs each config (the plan is checked) and
reports ``interpreter=True``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path

from moebench._interpret import interpreting  # first: it turns on the interpreter before Triton is imported
from moebench.errors import UserError
from moebench.models import MoEShape
from moebench.serve import triton_cache
from moebench.serve.triton_cache import cache_dir_env, kernel_entries
from moebench.tile import TileConfig

PATH = "triton"  # the path whose kernels moebench's tables configure
MAX_TOKENS = 4096  # the largest token count a plan covers unless told: a server's usual batch budget
# LaunchPlan fields that only size grids or are do_not_specialize arguments: they change with M and
# compile nothing new. A field added to LaunchPlan is part of the key until it is named here.
_COUNTS = ("slots", "max_blocks", "grid1", "grid2")

Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class WarmupPlan:
    """What ``warm`` runs: each (M, config) of ``items`` on each of ``shapes`` (one; a table that lists
    several hidden sizes or top-ks gives every combination), at ``dtype``: the first M of each distinct launch
    in 1..``max_tokens``. ``source`` is the lookup's label ('shipped:<file>', 'heuristic', ...) or the table
    file; ``dropped`` how many M of that range launch as a kept one does; ``notes`` what a user should hear
    (a table for another device, a newer version)."""

    shapes: tuple[MoEShape, ...]
    dtype: str
    source: str
    items: tuple[tuple[int, TileConfig], ...]  # (M tokens, config), M ascending
    dropped: int = 0
    notes: tuple[str, ...] = ()
    max_tokens: int = MAX_TOKENS

    @property
    def name(self) -> str:
        """The shape as a summary names it: its name, or the names of all of them."""
        return ", ".join(s.name for s in self.shapes)

    @property
    def runs(self) -> int:
        return len(self.items) * len(self.shapes)


@dataclass(frozen=True)
class WarmupReport:
    configs: int  # (shape, M, config) runs
    kernels: int  # compiled kernels the cache gained
    seconds: float  # wall time, the workers' start included
    cache_dir: str
    failures: tuple[str, ...]  # one line per run that could not run
    interpreter: bool  # on the Triton interpreter: nothing compiled, a dry run

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def launch_key(shape: MoEShape, dtype: str, M: int, config: TileConfig) -> tuple | None:
    """What decides the kernels ``config`` compiles at M tokens (see the module doc); None for a config
    the scheme or the shapes cannot run."""
    return _key_maker(shape, dtype)(M, config)


def _key_maker(shape: MoEShape, dtype: str) -> Callable[[int, TileConfig], tuple | None]:
    """``launch_key`` for one shape and dtype as a function of (M, config), what does not change with M
    worked out once: a plan asks it at every M up to a few thousand."""
    from moebench.dtypes import get_dtype
    from moebench.kernels.align import ONE_PROGRAM_SLOTS
    from moebench.kernels.fused_moe import DeviceFacts, LaunchPlan, LayerShapes, launch_plan

    spec = get_dtype(dtype)
    static, act, weight_bytes = spec.static_act, spec.act, spec.weight_bytes
    flags = tuple(f.name for f in fields(LaunchPlan) if f.name not in _COUNTS)
    facts = DeviceFacts(pdl=False, interpreting=False)  # the same at every M: any fixed ones compare M alike

    def key(M: int, config: TileConfig) -> tuple | None:
        shapes = LayerShapes(M, shape.experts, shape.hidden, shape.intermediate, shape.topk,
                             static_scales=static, out_dtype=act, weight_bytes=weight_bytes)
        try:
            plan = launch_plan(config, spec.fp8_scheme, shapes, facts)
        except UserError:
            return None
        return config, tuple(getattr(plan, f) for f in flags), plan.align and plan.slots <= ONE_PROGRAM_SLOTS

    return key


def _dedup(shapes: tuple[MoEShape, ...], dtype: str,
           pairs: list[tuple[int, TileConfig]]) -> tuple[tuple[tuple[int, TileConfig], ...], int]:
    """(kept, how many dropped): each pair in ascending M, left out where it is the same launch on every shape
    as a pair kept before it. A config a shape cannot run (no key) is kept at its first M only: its runs would
    all fail alike, and one line says so."""
    makers = [_key_maker(s, dtype) for s in shapes]
    kept, dropped, seen = [], 0, set()
    for M, cfg in sorted(pairs, key=lambda p: p[0]):
        keys = tuple(key(M, cfg) or (cfg, None) for key in makers)
        if keys in seen:
            dropped += 1
            continue
        seen.add(keys)
        kept.append((M, cfg))
    return tuple(kept), dropped


def _check_max_tokens(max_tokens: int) -> None:
    if max_tokens < 1:
        raise UserError(f"max_tokens must be at least 1 (the plan covers 1..max_tokens), not {max_tokens}")


def _check_fits(shapes: tuple[MoEShape, ...], dtype: str, max_tokens: int) -> None:
    """UserError where the largest point of the plan (``max_tokens`` tokens, no reference: a first run builds
    none) cannot fit in this device's memory; before a plan of ``max_tokens`` entries is built."""
    from moebench.paths.base import Target
    from moebench.problem import Problem, check_fits

    check_fits([Problem(s, max_tokens, dtype) for s in shapes], Target.current().device, reference=False)


def _table_pairs(table, max_tokens: int) -> list[tuple[int, TileConfig]]:
    """(M, the config the lookup reads at M) for every M of 1..``max_tokens``: its nearest key's."""
    return [(M, table.nearest(M)) for M in range(1, max_tokens + 1)]


def _fitted_label(chosen: list) -> str:
    """A plan's source where no table is there: 'heuristic', or 'fitted from <the tables>' (and where the fit
    gave nothing at some M, '; heuristic elsewhere')."""
    names = sorted({c.table.name for c in chosen if c.source == "fitted"})
    if not names:
        return "heuristic"
    rest = "; heuristic elsewhere" if any(c.source == "heuristic" for c in chosen) else ""
    return f"fitted from {', '.join(names)}{rest}"


def _as_list(value) -> list:
    return list(value) if isinstance(value, list) else [value]


def plan_for_table(table_path: Path | str, max_tokens: int = MAX_TOKENS) -> WarmupPlan:
    """Every launch a moebench table file gives for 1..``max_tokens`` tokens (each M at its nearest key), on
    the shape (or shapes) its header names, at its dtype. A missing file, another format or an empty table is
    a one-line UserError (``load_table``'s)."""
    from moebench.dtypes import get_dtype
    from moebench.environment import device_name
    from moebench.tables.formats.moebench import PATH as KERNEL
    from moebench.tables.formats.moebench import load_table

    _check_max_tokens(max_tokens)
    path = Path(table_path)
    meta, table = load_table(path)
    if meta.kernel != KERNEL:
        raise UserError(f"{path}: configs of kernel {meta.kernel!r}; warmup compiles moebench's {KERNEL!r}")
    get_dtype(meta.dtype)
    s = meta.shape
    try:
        shapes = tuple(
            MoEShape(f"E={s['experts']},N={s['intermediate']},hidden={h},topk={k}", s["experts"], h,
                     s["intermediate"], k)
            for h in _as_list(s["hidden"]) for k in _as_list(s["topk"]))
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    _check_fits(shapes, meta.dtype, max_tokens)
    notes = [meta.warning] if meta.warning else []
    here = device_name()
    if meta.device_name.replace(" ", "_") != here.replace(" ", "_"):
        notes.append(f"note: {path.name} was tuned on {meta.device_name}; its configs are compiled for {here}")
    items, dropped = _dedup(shapes, meta.dtype, _table_pairs(table, max_tokens))
    return WarmupPlan(shapes, meta.dtype, str(path), items, dropped, tuple(notes), max_tokens)


def plan_for_model(shape: MoEShape, dtype: str, configs_dir: Path | str | None = None,
                   max_tokens: int = MAX_TOKENS) -> WarmupPlan:
    """Every launch the triton path makes for ``shape`` at 1..``max_tokens`` tokens on this device: the
    configs of the table its lookup picks (``configs_dir``, then $MOEBENCH_CONFIGS, then the shipped tables),
    each M at its nearest key; where there is none, what the lookup runs at each M: the fitted default, else the
    heuristic config."""
    from moebench.environment import device_name
    from moebench.paths.registry import get_path
    from moebench.problem import Problem
    from moebench.tables import lookup

    _check_max_tokens(max_tokens)
    _check_fits((shape,), dtype, max_tokens)
    configs_dir, device = lookup.check_dir(configs_dir), device_name()
    found = lookup.find_table(shape.experts, shape.intermediate, device, dtype, configs_dir)
    if found is not None:
        source, path, table = found
        pairs, label = _table_pairs(table, max_tokens), f"{source}:{path.name}"
    else:
        from moebench.tables.fitted import Where

        heuristic, fit = get_path(PATH).default_config, lookup.fit_for(device, configs_dir)
        chosen = [(M, lookup.fitted_or(heuristic(Problem(shape, M, dtype)), fit,
                                       Where(M, shape.experts, shape.topk, shape.hidden, shape.intermediate), dtype))
                  for M in range(1, max_tokens + 1)]
        pairs, label = [(M, c.config) for M, c in chosen], _fitted_label([c for _, c in chosen])
    items, dropped = _dedup((shape,), dtype, pairs)
    return WarmupPlan((shape,), dtype, label, items, dropped, (), max_tokens)


def warm(plan: WarmupPlan, jobs: int, cache_dir: Path | None = None,
         on_progress: Progress | None = None) -> WarmupReport:
    """Run every (shape, M, config) of ``plan`` once in up to ``jobs`` worker processes (0: in this one),
    compiling into ``cache_dir`` (default: Triton's). A config that cannot run is a line of ``failures``."""
    started = time.monotonic()
    if cache_dir is not None:
        cache_dir = Path(cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
    with cache_dir_env(cache_dir):
        where = triton_cache.cache_dir()
        before = kernel_entries(where)
        errors = _run_all(plan, jobs, on_progress or (lambda what, done, total: None))
        gained = kernel_entries(where) - before
    failures = tuple(f"{shape.name} M={M} {cfg.label}: {err}" for (shape, M, cfg), err in errors if err)
    return WarmupReport(plan.runs, len(gained), time.monotonic() - started, str(where), failures, interpreting())


def _run_all(plan: WarmupPlan, jobs: int, on_progress: Progress) -> list[tuple[tuple, str | None]]:
    """((shape, M, config), None or why it could not run) of every run, shape by shape (a pool holds one
    shape's weights); within a shape every M at once, as many at a time as the pool has workers."""
    from moebench.problem import Problem
    from moebench.workers import jobs as first_runs
    from moebench.workers.precompile import Precompiler

    runs = [(shape, M, cfg) for shape in plan.shapes for M, cfg in plan.items]
    results: dict[int, str | None] = {}

    def done(i: int, error: str | None) -> None:
        results[i] = error
        shape, M, _ = runs[i]
        on_progress(f"{shape.name} M={M}", len(results), len(runs))

    on_progress("starting", 0, len(runs))
    with Precompiler(jobs) if jobs > 0 else nullcontext() as pool:
        for shape in plan.shapes:
            mine = [i for i, r in enumerate(runs) if r[0] == shape]
            items = [(Problem(shape, runs[i][1], plan.dtype), runs[i][2]) for i in mine]
            if pool is not None and items:
                pool.compile_runs(PATH, [], items[0][0])  # starts the shape's pool: how many workers fit
            if pool is None or pool.workers == 0:  # no worker (none asked, or no GPU memory for one): here
                try:
                    for i, (problem, cfg) in zip(mine, items):
                        done(i, first_runs.first_run(PATH, problem, cfg)[-1])
                finally:
                    first_runs.release()  # the shape's weights, given back
                continue
            pool.compile_runs(PATH, items, on_done=lambda j, err, mine=mine: done(mine[j], err))
    return [(runs[i], results[i]) for i in range(len(runs))]
