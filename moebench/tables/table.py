"""``ConfigTable``: tile configs keyed by token count M, read at the key nearest M, in the engines' JSON.

vLLM and SGLang hold one such table per file: ``{"<M>": {six tile keys}}``, written as
``json.dump(configs, f, indent=4)`` plus a newline, keys in ascending M, each value with vLLM's six keys in its
order; both read a file by turning its keys into ints and picking ``configs[min(configs, key=lambda x: abs(x - M))]``,
so a tie goes to the key first in the file. ``ConfigTable`` follows that rule (``nearest``, over the keys in the
file's order) for every reader, moebench's lookup included, and writes and reads that text (``to_json``,
``from_json``; an entry is read as the engines read it, ``engine_entry``, its other keys kept). ``ENGINE_PATH``
names the path whose timings pick the engines' configs; ``Provenance`` is what an export records of where a table
came from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from moebench.bounded import parse_json, read_text
from moebench.errors import UserError, short
from moebench.tile import TileConfig

ENGINE_PATH = "triton-classic"  # the path that runs the engines' kernel form, whose timings pick their configs
# The same form with the table's config on GEMM2 alone: the path that times SGLang's ``_down`` tables.
ENGINE_DOWN_PATH = "triton-classic-down"


class ConfigTable(Mapping[int, TileConfig]):
    """Tile configs keyed by token count M, as in a vLLM/SGLang config file; iterated in ascending M.

    ``order``: the keys as the file lists them (default ascending), which the nearest-M rule breaks ties by and
    ``to_json`` writes in; ``extras``: per M, keys an engine's entry carries beside the six (SGLang's
    ``USE_TMA``), written back as they were."""

    def __init__(self, entries: Mapping[int, TileConfig] | None = None, *, order: Iterable[int] | None = None,
                 extras: Mapping[int, Mapping] | None = None) -> None:
        entries = dict(entries or {})
        for m, cfg in entries.items():
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise ValueError(f"config table key {m!r} must be a token count (int >= 1)")
            if not isinstance(cfg, TileConfig):
                raise TypeError(f"config table value for M={m} is a {type(cfg).__name__}, not a TileConfig")
        self._entries = {m: entries[m] for m in sorted(entries)}
        order = list(dict.fromkeys(order)) if order is not None else list(self._entries)
        if sorted(order) != list(self._entries):
            raise ValueError("config table order must list each key once")
        self.order: tuple[int, ...] = tuple(order)
        self.extras: dict[int, dict] = {m: dict(v) for m, v in (extras or {}).items() if m in entries and v}

    def __getitem__(self, m: int) -> TileConfig:
        return self._entries[m]

    def __iter__(self) -> Iterator[int]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"ConfigTable({self._entries!r})"

    def nearest(self, m: int) -> TileConfig:
        """The config the engines use for M tokens: the key minimizing |key - M|.

        Ties go to the first such key in the file's order (Python's ``min`` over the keys vLLM and SGLang read
        from the file); files written by ``to_json`` from a tune list M ascending, so the smaller key wins there.
        """
        return self._entries[self.nearest_key(m)]

    def nearest_key(self, m: int) -> int:
        """The key ``nearest`` reads for M tokens."""
        if not self._entries:
            raise UserError("config table is empty: no tile config for any M")
        return nearest_key(self.order, m)

    def to_json(self, triton_version: str | None = None) -> str:
        """The file's text: keys as strings in ``order`` (ascending M unless read from a file listing them
        otherwise), vLLM's six keys in its order and then any carried keys, indent 4; with ``triton_version``, a
        last top-level entry naming the Triton the table was tuned with (as vLLM's tuner writes it; vLLM drops it
        when reading, SGLang does not)."""
        payload: dict = {str(m): self.entry(m) for m in self.order}
        if triton_version is not None:
            payload["triton_version"] = triton_version
        return json.dumps(payload, indent=4) + "\n"

    def entry(self, m: int) -> dict:
        """The entry of M as an engine's file holds it: vLLM's six keys in its order, then any carried keys."""
        return {**self._entries[m].to_vllm_dict(), **self.extras.get(m, {})}

    @classmethod
    def from_json(cls, source: str | Path) -> ConfigTable:
        """Read a vLLM/SGLang config file (a Path, or a str holding a path or the JSON text itself).

        A ``"triton_version"`` entry is ignored, as vLLM does. Each entry is read as the engines read it
        (``engine_entry.read_entry``: BLOCK_SIZE_M 8 taken, other keys kept). Bad JSON, keys that are not token
        counts, or entries the engines' launch would not take are a UserError naming the file.
        """
        if isinstance(source, Path) or not source.lstrip().startswith("{"):
            name = str(source)
            text = read_text(source, gz=False)
        else:
            name, text = "<config JSON>", source
        raw = parse_json(text, name)
        if not isinstance(raw, dict):
            raise UserError(f"{name}: expected a JSON object keyed by token count M")
        raw.pop("triton_version", None)
        return engine_table(raw, name)


def engine_table(raw: Mapping, name: str, engine: str | None = None) -> ConfigTable:
    """An engine's ``{"<M>": {entry}}`` as a ConfigTable in the file's key order, each entry read as ``engine``
    reads it and its other keys kept; a bad key or entry, or none, is a UserError naming ``name``."""
    from moebench.tables.engine_entry import read_entry

    entries: dict[int, TileConfig] = {}
    extras: dict[int, dict] = {}
    order: list[int] = []
    for key, value in raw.items():
        m = _token_count(key, name)
        try:
            entries[m], extras[m] = read_entry(value, engine)
        except UserError as e:
            raise UserError(f"{name}: M={str(key)[:20]}: {e}") from None
        order.append(m)
    if not entries:
        raise UserError(f"{name}: no tile configs in the file")
    return ConfigTable(entries, order=order, extras=extras)


def _token_count(key, name: str) -> int:
    try:
        m = int(key)
    except ValueError:
        raise UserError(f"{name}: key {short(key)} is not a token count M") from None
    if m < 1:
        raise UserError(f"{name}: key {short(key)} must be a token count >= 1")
    return m


def entries_from_json(raw: Mapping, name: str) -> dict[int, TileConfig]:
    """moebench's own ``{"<M>": {tile fields}}`` as {M: TileConfig}, every field in moebench's ranges; a key that is
    no token count or a bad config is a UserError naming ``name``, as is an empty mapping."""
    entries: dict[int, TileConfig] = {}
    for key, value in raw.items():
        m = _token_count(key, name)
        if not isinstance(value, dict):
            raise UserError(f"{name}: M={key}: expected an object of tile parameters")
        try:
            entries[m] = TileConfig.from_dict(value)
        except UserError as e:
            raise UserError(f"{name}: M={key}: {e}") from None
        except TypeError as e:  # a required key is missing
            raise UserError(f"{name}: M={key}: {e}") from None
        except ValueError:
            raise UserError(f"{name}: M={key}: tile parameters must be integers") from None
    if not entries:
        raise UserError(f"{name}: no tile configs in the file")
    return entries


def nearest_key(keys: Iterable[int], m: int) -> int:
    """The engines' nearest-M rule: the key minimizing |key - M|, the first such key in ``keys``' order on a tie."""
    return min(keys, key=lambda k: abs(k - m))


@dataclass(frozen=True)
class Provenance:
    """Where an exported table's configs come from, as its file or the export's sidecar records it: the run's
    Triton and torch versions, when the export ran (UTC, ISO 8601), the run's commit and its folder."""

    triton_version: str | None = None
    torch_version: str | None = None
    created: str | None = None
    commit: str | None = None
    source_run: str | None = None
