"""Which tile config moebench's kernel (the triton path) runs at M tokens: a tuned table where one is found,
else the fitted default of the other tables, else the built-in heuristic (``tile.default_config``).

Tables are moebench's own files (``moebench.tables.formats.moebench``: every tile field, with provenance), one per
(experts, per-GPU intermediate size N, device, dtype), looked for in order in:

1. ``--configs DIR`` (``configs_dir``),
2. the folder named by the environment variable ``MOEBENCH_CONFIGS``,
3. the tables shipped in the package (``moebench/tables/shipped/``),

and read at the key nearest M, as vLLM reads its files (``ConfigTable.nearest``). Where none is there, every
table of the device in those folders (the first of each file name) feeds the fitted default
(``moebench.tables.fitted``): the config of the nearest tuned point, made runnable here; where no point is near
enough, the heuristic. ``Chosen.source`` says where the config came from, so each row of a sweep can say it
(``config_source``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from moebench.errors import UserError
from moebench.tables.fitted import Fit, Tuned, Where, fit_of
from moebench.tables.formats.moebench import FORMAT, file_name, load_table
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig

ENV_VAR = "MOEBENCH_CONFIGS"
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
SOURCES = ("configs", "env", "shipped", "fitted", "heuristic")  # in the order they are tried


@dataclass(frozen=True)
class Chosen:
    """A config and where it came from: ``source`` one of SOURCES; ``table`` and ``table_m`` (the key read)
    where it came from a table, or (fitted) the table and key of the nearest tuned point."""

    config: TileConfig
    source: str
    table: Path | None = None
    table_m: int | None = None

    @property
    def label(self) -> str:
        """How a row names it: 'heuristic', '<source>:<file name>@M=<key>', or 'fitted from <file name>@M=<key>'."""
        if self.table is None:
            return self.source
        if self.source == "fitted":
            return f"fitted from {self.table.name}@M={self.table_m}"
        return f"{self.source}:{self.table.name}@M={self.table_m}"


def check_dir(configs_dir: Path | str | None, what: str = "--configs") -> Path | None:
    """``configs_dir`` as a Path, UserError (one line, naming it as ``what``) where it is given and is not a
    folder."""
    if configs_dir is None:
        return None
    path = Path(configs_dir)
    if not path.is_dir():
        raise UserError(f"{what} {path}: no such folder of tables")
    return path


def table_dirs(configs_dir: Path | str | None = None) -> list[tuple[str, Path]]:
    """The folders tables are looked for in, in order, each with its source name."""
    dirs = []
    if configs_dir is not None:
        dirs.append(("configs", Path(configs_dir)))
    if env := os.environ.get(ENV_VAR):
        dirs.append(("env", Path(env)))
    dirs.append(("shipped", SHIPPED_DIR))
    return dirs


@lru_cache(maxsize=64)
def _load(path: Path, mtime_ns: int) -> ConfigTable:
    return load_table(path)[1]


def find_table(experts: int, n: int, device_name: str, dtype: str,
               configs_dir: Path | str | None = None) -> tuple[str, Path, ConfigTable] | None:
    """(source, file, table) of the first table for this kernel shape, device and dtype, or None."""
    name = file_name(experts, n, device_name, dtype)
    for source, folder in table_dirs(configs_dir):
        path = folder / name
        if path.is_file():
            return source, path, _load(path, path.stat().st_mtime_ns)
    return None


@lru_cache(maxsize=256)
def _tuned(path: Path, mtime_ns: int) -> Tuned | None:
    try:
        return Tuned.of_file(path)
    except UserError:
        return None  # a broken file is reported where it is read for its own shape, not for every other shape


@lru_cache(maxsize=64)
def _listing(folder: Path, mtime_ns: int) -> tuple[Path, ...]:
    """The moebench tables in ``folder`` as it was at ``mtime_ns`` (a file added, removed or renamed into it
    changes the folder's mtime)."""
    return tuple(sorted(folder.glob(f"{FORMAT}_*,device_name=*,dtype=*.json")))


def _table_files(configs_dir: Path | str | None, device_name: str | None) -> tuple[tuple[Path, int], ...]:
    """(file, mtime) of every moebench table (of ``device_name``; any device for None) in the lookup's folders,
    the first of each file name, as ``find_table`` would read it."""
    device = None if device_name is None else f",device_name={device_name.replace(' ', '_')},dtype="
    files: dict[str, Path] = {}
    for _, folder in table_dirs(configs_dir):
        try:
            listing = _listing(folder, folder.stat().st_mtime_ns)
        except OSError:
            continue  # no such folder: nothing in it
        for path in listing:
            if device is None or device in path.name:
                files.setdefault(path.name, path)
    out = []
    for p in files.values():
        try:
            out.append((p, p.stat().st_mtime_ns))
        except OSError:
            continue  # removed since the folder was listed
    return tuple(out)


def tuned_tables(configs_dir: Path | str | None = None, device_name: str | None = None) -> list[Tuned]:
    """The tables the fitted default reads (``_table_files``); files that do not load, or place no single
    shape, are left out."""
    return [t for p, mtime in _table_files(configs_dir, device_name) if (t := _tuned(p, mtime)) is not None]


def fit_for(device_name: str, configs_dir: Path | str | None = None) -> Fit:
    """The fitted default over every table of ``device_name`` in the lookup's folders (``tuned_tables``)."""
    return _fit(_table_files(configs_dir, device_name), device_name)


@lru_cache(maxsize=16)
def _fit(files: tuple[tuple[Path, int], ...], device_name: str) -> Fit:
    return fit_of([t for p, mtime in files if (t := _tuned(p, mtime)) is not None], device_name)


# (config key, experts, intermediate, hidden, top-k, dtype) of fitted configs that failed to compile here
_REFUSED: set[tuple] = set()


def refuse_fitted(config: TileConfig, experts: int, n: int, dtype: str, *, hidden: int, topk: int) -> None:
    """Remember that the device could not hold ``config`` fitted for this shape and dtype (Triton's
    OutOfResources at its first launch): ``choose`` gives the heuristic there from now on, in this process."""
    _REFUSED.add((config.key(), experts, n, hidden, topk, dtype))


def fitted_or(heuristic: TileConfig, fit: Fit, where: Where, dtype: str) -> Chosen:
    """What runs where no table is there: ``fit``'s config for ``where`` at ``dtype``, else ``heuristic``
    (also where that config was refused here, ``refuse_fitted``)."""
    fitted = fit.predict(where, dtype)
    refused = fitted is not None and (fitted.config.key(), where.experts, where.intermediate, where.hidden,
                                      where.topk, dtype) in _REFUSED
    if fitted is None or refused:
        return Chosen(heuristic, "heuristic")
    return Chosen(fitted.config, "fitted", fitted.table.path, fitted.table_m)


def for_problem(problem, heuristic: TileConfig, configs_dir: Path | str | None = None) -> Chosen:
    """``choose`` for a ``moebench.problem.Problem`` on this process's device: what moebench's kernel runs for
    it (the lookup of a sweep, a trace and ``moebench profile``)."""
    from moebench.environment import device_name

    s = problem.shape
    return choose(problem.M, s.experts, s.intermediate, problem.dtype, device_name(), heuristic, configs_dir,
                  hidden=s.hidden, topk=s.topk, fit=s.routed_experts == s.experts)


def engine_table_for(problem, configs_dir: Path | str | None) -> Chosen | None:
    """The entry nearest M of the engines' table for ``problem`` in ``configs_dir`` (the file vLLM looks up for its
    shape, device and dtype: an engine's shipped file, or an export), for the engines' kernel form; None where
    there is no such file."""
    from moebench.environment import device_name
    from moebench.tables.files import read_table
    from moebench.tables.formats import vllm

    if configs_dir is None:
        return None
    s = problem.shape
    path = Path(configs_dir) / vllm.file_name(s.experts, s.intermediate, device_name(), problem.dtype)
    if not path.is_file():
        return None
    table = read_table(path).table
    key = table.nearest_key(problem.M)
    return Chosen(table[key], "configs", path, key)


def choose(M: int, experts: int, n: int, dtype: str, device_name: str, heuristic: TileConfig,
           configs_dir: Path | str | None = None, *, hidden: int, topk: int, fit: bool = True) -> Chosen:
    """The config for M tokens: the nearest key of the first table found, else the fitted default of the
    device's other tables (``hidden`` and ``topk`` place the problem; not with ``fit=False``: a layer whose ids
    range over more experts than it holds, an expert_map's, which the fit's point does not describe), else
    ``heuristic``."""
    found = find_table(experts, n, device_name, dtype, configs_dir)
    if found is None:
        if not fit:
            return Chosen(heuristic, "heuristic")
        return fitted_or(heuristic, fit_for(device_name, configs_dir), Where(M, experts, topk, hidden, n), dtype)
    source, path, table = found
    key = table.nearest_key(M)
    return Chosen(table[key], source, path, key)
