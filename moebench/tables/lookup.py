"""Which tile config moebench's kernel (the triton path) runs at M tokens: a tuned table where one is found,
else the built-in heuristic (``tile.default_config``).

Tables are moebench's own files (``moebench.tables.formats.moebench``: every tile field, with provenance), one per
(experts, per-GPU intermediate size N, device, dtype), looked for in order in:

1. ``--configs DIR`` (``configs_dir``),
2. the folder named by the environment variable ``MOEBENCH_CONFIGS``,
3. the tables shipped in the package (``moebench/tables/shipped/``),

and read at the key nearest M, as vLLM reads its files (``ConfigTable.nearest``). ``Chosen.source`` says
where the config came from, so each row of a sweep can say it (``config_source``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from moebench.errors import UserError
from moebench.tables.formats.moebench import file_name, load_table
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig

ENV_VAR = "MOEBENCH_CONFIGS"
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
SOURCES = ("configs", "env", "shipped", "heuristic")  # in the order they are tried


@dataclass(frozen=True)
class Chosen:
    """A config and where it came from: ``source`` one of SOURCES; ``table`` and ``table_m`` (the key read)
    where it came from a table."""

    config: TileConfig
    source: str
    table: Path | None = None
    table_m: int | None = None

    @property
    def label(self) -> str:
        """How a row names it: 'heuristic', or '<source>:<file name>@M=<key>'."""
        if self.table is None:
            return self.source
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


def choose(M: int, experts: int, n: int, dtype: str, device_name: str, heuristic: TileConfig,
           configs_dir: Path | str | None = None) -> Chosen:
    """The config for M tokens: the nearest key of the first table found, else ``heuristic``."""
    found = find_table(experts, n, device_name, dtype, configs_dir)
    if found is None:
        return Chosen(heuristic, "heuristic")
    source, path, table = found
    key = table.nearest_key(M)
    return Chosen(table[key], source, path, key)
