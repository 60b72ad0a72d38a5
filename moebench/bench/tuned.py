"""``sweep --tune``: each (shape, dtype) of a sweep tuned by ``moebench tune``'s search on each tunable path, over
the sweep's M, and its configs pinned as the points' configs.

Data flow: the sweep's plan -> one ``TuneRequest`` per (path, shape, dtype) -> ``tune.run.tune`` (a tune run folder
beside the sweep's, resumed like any tune) or the best.json of a finished tune of the same request under the same
folder -> per M the fastest of the choice, the path's default and the best hand-picked candidate, as the tune
re-timed them back to back -> ``Pins`` for ``SweepPlan.build``. The same search, seeds and rules as ``moebench tune``
(one search, not a second list of candidates), so a tuned sweep's rows are what a tune's table would run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from moebench.paths.registry import get_path
from moebench.problem import Problem
from moebench.store.best import fastest_entries, read_best
from moebench.store.resume import newest_complete
from moebench.tile import TileConfig

Pins = dict[tuple[str, str, int, str], TileConfig]  # (model, dtype, M, path) -> the config the point runs


def requests(problems: list[tuple[Problem, str]], options: tuple[tuple[str, int], ...] = ()) -> list:
    """One ``TuneRequest`` per (path, shape, dtype, routing, seed) among ``problems`` ((problem, path name) of the
    points a path can run here) whose path is tunable, over that group's M values."""
    from moebench.tune.run import TuneRequest

    groups: dict[tuple, set[int]] = {}
    for p, name in problems:
        if get_path(name).tunable:
            groups.setdefault((name, p.shape, p.dtype, p.routing, p.seed), set()).add(p.M)
    return [TuneRequest(shape, dtype, path=name, ms=tuple(sorted(ms)), options=options, routing=routing, seed=seed)
            for (name, shape, dtype, routing, seed), ms in groups.items()]


def tune_pins(problems: list[tuple[Problem, str]], out_base: Path, *, compile_jobs: int | None = None,
              options: tuple[tuple[str, int], ...] = (), on_note: Callable[[str], None] | None = None,
              on_progress: Callable[[str, int, int], None] | None = None) -> tuple[Pins, list[Path]]:
    """Tune every tunable (path, shape, dtype) of ``problems`` under ``out_base`` (a finished tune of the same
    request there is read, not run again) and return the configs to pin and the tune run folders; ``on_note``
    hears which tune starts, ``on_progress`` its phases (as ``moebench tune``'s bar does)."""
    from moebench.tune.run import tune as run_tune

    pins: Pins = {}
    folders = []
    for request in requests(problems, options):
        folder = newest_complete(out_base, request.key)
        if folder is None:
            if on_note:
                ms = ",".join(map(str, request.ms))
                on_note(f"tuning {request.path} {request.shape.name} {request.dtype} at M={ms}")
            folder = run_tune(request, out_base, compile_jobs=compile_jobs, on_progress=on_progress).run_dir
        for m, config in fastest_entries(read_best(folder)).items():
            pins[(request.shape.name, request.dtype, m, request.path)] = TileConfig.from_dict(config)
        folders.append(Path(folder))
    return pins, folders
