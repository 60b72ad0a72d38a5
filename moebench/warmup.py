"""Compile every config of a tile table ahead of serving, in worker processes, into Triton's on-disk cache.

A plan (``WarmupPlan``) is what the triton path would run: the configs of a table file given directly
(``plan_for_table``), or of the table the lookup picks for a shape (``plan_for_model``: --configs, env,
shipped; else the heuristic config at each M of a list). ``warm`` runs each (M, config) once on every shape
of the plan in ``precompile.Precompiler``'s workers, which compile the kernels into ``TRITON_CACHE_DIR``;
a later process finds them there and loads them instead of compiling. It counts the kernels the cache
gained (``kernel_entries``) and lists the configs that could not run, without stopping at them.

Two pairs of one config at different M are "the same launch" when ``launch_key`` is equal: the config and
every flag of ``fused_moe.launch_plan`` but the grid sizes and token counts (the kernels take those as
``do_not_specialize`` arguments), and the align step's kernel (one program up to ``ONE_PROGRAM_SLOTS``
slots). Such a pair compiles nothing the first did not, so only the first is kept; a pair whose config
differs, or whose M changes a flag (e.g. who zeroes the top-k sums), is always kept.

On the Triton interpreter nothing is compiled: ``warm`` still runs each config (the plan is checked) and
reports ``interpreter=True``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path

from moebench import triton_cache
from moebench._interpret import interpreting  # first: it turns on the interpreter before Triton is imported
from moebench.errors import UserError
from moebench.models import MoEShape
from moebench.tile import TileConfig
from moebench.triton_cache import cache_dir_env, kernel_entries

PATH = "triton"  # the path whose kernels moebench's tables configure
# LaunchPlan fields that only size grids or are do_not_specialize arguments: they change with M and
# compile nothing new. A field added to LaunchPlan is part of the key until it is named here.
_COUNTS = ("slots", "max_blocks", "grid1", "grid2")

Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class WarmupPlan:
    """What ``warm`` runs: each (M, config) of ``items`` on each of ``shapes`` (one; a table that lists
    several hidden sizes or top-ks gives every combination), at ``dtype``. ``source`` is the lookup's label
    ('shipped:<file>', 'heuristic', ...) or the table file; ``dropped`` the table's M left out as the same
    launch as a kept one; ``notes`` what a user should hear (a table for another device, a newer version)."""

    shapes: tuple[MoEShape, ...]
    dtype: str
    source: str
    items: tuple[tuple[int, TileConfig], ...]  # (M tokens, config), M ascending
    dropped: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()

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
    the scheme or the shapes cannot run, which is never taken for the same launch as another."""
    from moebench.dtypes import get_dtype
    from moebench.kernels.align import ONE_PROGRAM_SLOTS
    from moebench.kernels.fused_moe import DeviceFacts, LayerShapes, launch_plan

    spec = get_dtype(dtype)
    shapes = LayerShapes(M, shape.experts, shape.hidden, shape.intermediate, shape.topk,
                         static_scales=spec.static_act, out_dtype=spec.act, weight_bytes=spec.weight_bytes)
    try:  # the device's facts are the same at every M: any fixed ones compare M alike
        plan = launch_plan(config, spec.fp8_scheme, shapes, DeviceFacts(pdl=False, interpreting=False))
    except UserError:
        return None
    one_program = plan.align and plan.slots <= ONE_PROGRAM_SLOTS
    return config, replace(plan, **dict.fromkeys(_COUNTS, 0)), one_program


def _dedup(shapes: tuple[MoEShape, ...], dtype: str,
           pairs: list[tuple[int, TileConfig]]) -> tuple[tuple[tuple[int, TileConfig], ...], tuple[int, ...]]:
    """(kept, dropped M): each pair in ascending M, left out where it is the same launch on every shape as a
    pair kept before it."""
    kept, dropped, seen = [], [], set()
    for M, cfg in sorted(pairs, key=lambda p: p[0]):
        keys = tuple(launch_key(s, dtype, M, cfg) for s in shapes)
        if None not in keys and keys in seen:
            dropped.append(M)
            continue
        seen.add(keys)
        kept.append((M, cfg))
    return tuple(kept), tuple(dropped)


def _as_list(value) -> list:
    return list(value) if isinstance(value, list) else [value]


def plan_for_table(table_path: Path | str) -> WarmupPlan:
    """Every key of a moebench table file, on the shape (or shapes) its header names, at its dtype.
    A missing file, another format or an empty table is a one-line UserError (``load_table``'s)."""
    from moebench.dtypes import get_dtype
    from moebench.environment import device_name
    from moebench.tables import KERNEL, load_table

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
    notes = [meta.warning] if meta.warning else []
    here = device_name()
    if meta.device_name.replace(" ", "_") != here.replace(" ", "_"):
        notes.append(f"note: {path.name} was tuned on {meta.device_name}; its configs are compiled for {here}")
    items, dropped = _dedup(shapes, meta.dtype, list(table.items()))
    return WarmupPlan(shapes, meta.dtype, str(path), items, dropped, tuple(notes))


def plan_for_model(shape: MoEShape, dtype: str, configs_dir: Path | str | None = None,
                   ms: tuple[int, ...] | None = None) -> WarmupPlan:
    """Every key of the table the triton path's lookup picks for ``shape`` on this device (``configs_dir``,
    then $MOEBENCH_CONFIGS, then the shipped tables); where there is none, the heuristic config at each M
    of ``ms`` (default: vLLM's 18 batch sizes)."""
    from moebench import lookup
    from moebench.environment import device_name
    from moebench.paths import get_path
    from moebench.problem import Problem

    found = lookup.find_table(shape.experts, shape.intermediate, device_name(), dtype,
                              lookup.check_dir(configs_dir))
    if found is not None:
        source, path, table = found
        pairs, label = list(table.items()), f"{source}:{path.name}"
    else:
        if ms is None:
            from moebench.tune.run import VLLM_MS

            ms = VLLM_MS
        heuristic = get_path(PATH).default_config
        pairs, label = [(M, heuristic(Problem(shape, M, dtype))) for M in sorted(set(ms))], "heuristic"
    items, dropped = _dedup((shape,), dtype, pairs)
    return WarmupPlan((shape,), dtype, label, items, dropped)


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
    from moebench import precompile
    from moebench.problem import Problem

    runs = [(shape, M, cfg) for shape in plan.shapes for M, cfg in plan.items]
    results: dict[int, str | None] = {}

    def done(i: int, error: str | None) -> None:
        results[i] = error
        shape, M, _ = runs[i]
        on_progress(f"{shape.name} M={M}", len(results), len(runs))

    on_progress("starting", 0, len(runs))
    with precompile.Precompiler(jobs) if jobs > 0 else nullcontext() as pool:
        for shape in plan.shapes:
            mine = [i for i, r in enumerate(runs) if r[0] == shape]
            items = [(Problem(shape, runs[i][1], plan.dtype), runs[i][2]) for i in mine]
            if pool is not None and items:
                pool.compile_runs(PATH, [], items[0][0])  # starts the shape's pool: how many workers fit
            if pool is None or pool.workers == 0:  # no worker (none asked, or no GPU memory for one): here
                for i, (problem, cfg) in zip(mine, items):
                    done(i, precompile.run_candidate(PATH, problem, cfg))
                continue
            pool.compile_runs(PATH, items, on_done=lambda j, err, mine=mine: done(mine[j], err))
    return [(runs[i], results[i]) for i in range(len(runs))]
