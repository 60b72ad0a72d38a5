"""Tile-config tables in vLLM's and SGLang's file layout: naming, nearest-M lookup, the best config per M, writing.

What the serving engines do (checked against their sources):

- vLLM (``vllm/model_executor/layers/fused_moe/fused_moe.py``: ``get_config_file_name``,
  ``get_moe_configs``, ``try_get_optimal_moe_config``) looks for
  ``E={E},N={N},device_name={device}[,dtype={dtype}][,block_shape=[bn,bk]].json``, with
  ``E, _, N = w2.shape`` (local experts, per-GPU intermediate size),
  ``device = get_device_name().replace(" ", "_")`` and any device whose name has an
  ``H200`` part mapped to ``NVIDIA_H200``; the block shape is written without
  spaces (``[128,128]``); fp8 is ``dtype=fp8_w8a8`` and float32 activations
  ``dtype=float32``. It reads the file from ``$VLLM_TUNED_CONFIG_FOLDER`` or its
  own ``configs/`` folder, drops a top-level ``"triton_version"`` entry, turns the keys into
  ints, and picks ``configs[min(configs.keys(), key=lambda x: abs(x - M))]``.
- SGLang (``python/sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``,
  earlier ``layers/moe/fused_moe_triton/fused_moe_triton_config.py``) uses the same
  pattern but formats the block shape as a Python list (``[128, 128]``, with the
  space), does not rename H200 variants, adds ``,per_channel_quant=True`` for
  per-channel fp8, and reads ``<dir>/configs/triton_<x_y_z>/<name>``, ``<dir>`` being
  ``$SGLANG_MOE_CONFIG_DIR`` or its package folder and ``x_y_z`` the serving
  ``triton.__version__`` with dots replaced by underscores. Missing that file, it lists
  ``<dir>/configs/`` (an error where that folder does not exist), reads every ``triton_*``
  name there as dot-separated integers, and takes the newest other version holding the file,
  with a warning. It turns every key into an int, dropping nothing: a ``"triton_version"``
  entry would fail there, so SGLang files carry none. Same nearest-M rule.

Both read files written as ``json.dump(configs, f, indent=4)`` plus a newline,
keys in ascending M, values with the six keys in vLLM's order.

Engine files hold configs timed on the engines' kernel form (path ``triton-classic``: GEMM1 over the 2I
gate-and-up columns, the activation after it); moebench's own kernel's tables are ``moebench.tables.own``'s.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pandas as pd

from moebench.dtypes import get_dtype
from moebench.errors import UserError
from moebench.store.atomic import write_text_atomic
from moebench.tile import FIELDS, TileConfig

LAYOUTS = ("vllm", "sglang")
ENGINE_PATH = "triton-classic"  # the path that runs the engines' kernel form, whose timings pick their configs
ENGINE_KEYS = tuple(f.name for f in FIELDS if f.engine)  # the six parameters the engines' kernel reads
TABLE_KEY = ("experts", "intermediate", "dtype", "device_name")  # the key of best_configs' result
# SGLang 0.5.23 runs Triton 3.8; triton.__version__ prints releases as X.Y.Z.
SGLANG_TRITON = "3.8.0"
_BLOCK_SHAPES = {"block128": [128, 128]}  # fp8 scheme -> [block_n, block_k]
_PROBLEM = ("model", "hidden", "topk", "routing")  # what else can differ between rows of one table


def _device_for_file(device_name: str, layout: str) -> str:
    device = device_name.replace(" ", "_")
    if layout == "vllm" and "H200" in device.split("_"):
        device = "NVIDIA_H200"  # vLLM folds the H200 family (e.g. "NVIDIA H200 NVL") into one name
    return device


def _dtype_selector(dtype: str, layout: str) -> str:
    spec = get_dtype(dtype)
    if layout == "vllm":
        return spec.vllm_suffix
    # SGLang: the block shape as Python prints a list ("[128, 128]"), per-channel fp8 marked
    sel = ",dtype=fp8_w8a8" if spec.is_fp8 else spec.vllm_suffix
    block = _BLOCK_SHAPES.get(spec.fp8_scheme or "")
    if block is not None:
        sel += f",block_shape={block}"
    if spec.fp8_scheme == "channel":
        sel += ",per_channel_quant=True"
    return sel


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise UserError(f"unknown config layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")


def config_file_name(experts: int, n: int, device_name: str, dtype: str, layout: str = "vllm") -> str:
    """The file name the engine looks up for E experts, per-GPU intermediate size N, a device and dtype.

    ``device_name`` is ``torch.cuda.get_device_name()`` as recorded in the rows
    (e.g. "NVIDIA H200"); ``dtype`` a moebench dtype name.
    """
    _check_layout(layout)
    device = _device_for_file(device_name, layout)
    return f"E={experts},N={n},device_name={device}{_dtype_selector(dtype, layout)}.json"


def sglang_triton_dir(engine_triton: str) -> str:
    """SGLang's folder for the Triton version its server runs: ``triton_<x_y_z>``.

    The version must read as SGLang reads folder names back (dot-separated integers, as
    ``triton.__version__`` prints a release): a name like ``triton_3_8_0+git1`` would make
    SGLang's fallback scan of ``configs/`` fail.
    """
    if not re.fullmatch(r"\d+\.\d+\.\d+", engine_triton or ""):
        raise UserError(f"--engine-triton {engine_triton!r}: give the serving engine's Triton release as X.Y.Z "
                        f"(e.g. {SGLANG_TRITON})")
    return f"triton_{engine_triton.replace('.', '_')}"


class ConfigTable(Mapping[int, TileConfig]):
    """Tile configs keyed by token count M, as in a vLLM/SGLang config file; keys kept in ascending order."""

    def __init__(self, entries: Mapping[int, TileConfig] | None = None) -> None:
        entries = dict(entries or {})
        for m, cfg in entries.items():
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise ValueError(f"config table key {m!r} must be a token count (int >= 1)")
            if not isinstance(cfg, TileConfig):
                raise TypeError(f"config table value for M={m} is a {type(cfg).__name__}, not a TileConfig")
        self._entries = {m: entries[m] for m in sorted(entries)}

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

        Ties go to the first such key in file order (Python's ``min``); files
        written by ``to_json`` (and vLLM's own) list M ascending, so the smaller key wins.
        """
        return self._entries[self.nearest_key(m)]

    def nearest_key(self, m: int) -> int:
        """The key ``nearest`` reads for M tokens."""
        if not self._entries:
            raise UserError("config table is empty: no tile config for any M")
        return min(self._entries, key=lambda k: abs(k - m))

    def to_json(self, triton_version: str | None = None) -> str:
        """The file's text: keys as strings in ascending M, vLLM's six keys in its order, indent 4; with
        ``triton_version``, a last top-level entry naming the Triton the table was tuned with (as vLLM's tuner
        writes it; vLLM drops it when reading, SGLang does not)."""
        payload: dict = {str(m): cfg.to_vllm_dict() for m, cfg in self._entries.items()}
        if triton_version is not None:
            payload["triton_version"] = triton_version
        return json.dumps(payload, indent=4) + "\n"

    @classmethod
    def from_json(cls, source: str | Path) -> ConfigTable:
        """Read a vLLM/SGLang config file (a Path, or a str holding a path or the JSON text itself).

        A ``"triton_version"`` entry is ignored, as vLLM does. Bad JSON, keys that
        are not token counts, or configs with unknown or missing keys are a
        UserError naming the file.
        """
        if isinstance(source, Path) or not source.lstrip().startswith("{"):
            name = str(source)
            try:
                text = Path(source).read_text()
            except OSError as e:
                raise UserError(f"{name}: cannot read config file ({e.strerror or e})") from None
        else:
            name, text = "<config JSON>", source
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{name}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
        if not isinstance(raw, dict):
            raise UserError(f"{name}: expected a JSON object keyed by token count M")
        raw.pop("triton_version", None)
        return cls(entries_from_json(raw, name))


def entries_from_json(raw: Mapping, name: str) -> dict[int, TileConfig]:
    """``{"<M>": {tile fields}}`` as {M: TileConfig}; a key that is no token count or a bad config is a UserError
    naming ``name``, as is an empty mapping."""
    entries: dict[int, TileConfig] = {}
    for key, value in raw.items():
        try:
            m = int(key)
        except ValueError:
            raise UserError(f"{name}: key {key!r} is not a token count M") from None
        if m < 1:
            raise UserError(f"{name}: key {key!r} must be a token count >= 1")
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


def flag(v: object) -> bool | None:
    """A row's bool column as True/False, or None where it is missing."""
    return None if v is None or pd.isna(v) else bool(v)


def _tile(config: Mapping, path: str) -> TileConfig:
    """A row's config as the path ran it: the engines' form reads the six engine fields only."""
    if path == ENGINE_PATH:
        return TileConfig.from_dict({k: v for k, v in config.items() if k in ENGINE_KEYS})
    return TileConfig.from_dict(dict(config))


PICK_PHASES = ("default", "final")  # a tune's re-timings, most comparable first (see timed_rows)


def timed_rows(df: pd.DataFrame, path: str = ENGINE_PATH) -> pd.DataFrame:
    """The rows of ``path`` that can pick a config: status ok, not found incorrect, a config and a time; at a
    (table, M) that has rows of phase "default" (a tune's choice and the path's default re-timed back to
    back), only those, so a table never holds a config slower than the default beside it; else of phase
    "final" (the re-timings of a tune's best candidates), only those.

    Adds ``_tile`` (the row's TileConfig as the path ran it) and ``_table`` (its key in ``best_configs``'
    result). Rows from the CPU interpreter are refused (UserError): their timings say nothing about which
    tile is fastest on a GPU.
    """
    rows = df[(df["path"] == path) & (df["status"] == "ok") & df["time_us"].notna()]
    rows = rows[rows["config"].map(lambda c: isinstance(c, Mapping)).astype(bool)]
    if "correct" in rows.columns:
        rows = rows[rows["correct"].map(lambda v: flag(v) is not False).astype(bool)]
    if rows.empty:
        return rows.assign(_tile=None, _table=None)
    if "interpreter" in rows.columns and rows["interpreter"].map(lambda v: flag(v) is True).any():
        raise UserError("tile configs come from GPU runs only; this run timed the CPU interpreter")
    for phase in PICK_PHASES:  # the first phase a (table, M) has rows of, only those
        at = rows["phase"].eq(phase) if "phase" in rows.columns else pd.Series(False, index=rows.index)
        has = at.groupby([rows[c] for c in (*TABLE_KEY, "M")], dropna=False).transform("any")
        rows = rows[at | ~has.astype(bool)]
    keys = [table_key(k) for k in rows[list(TABLE_KEY)].itertuples(index=False, name=None)]
    return rows.assign(_tile=rows["config"].map(lambda c: _tile(c, path)), _table=keys)


def table_key(values: tuple) -> tuple:
    experts, n, dtype, device = values
    return int(experts), int(n), str(dtype), str(device)


def best_configs(df: pd.DataFrame, path: str = ENGINE_PATH) -> dict[tuple, ConfigTable]:
    """The fastest tile config per (experts, intermediate, dtype, device_name) and M, from a run's rows of
    ``path`` (``timed_rows``): by default the engines' kernel form, whose six fields are what their files hold;
    with ``path="triton"``, moebench's own kernel with every tile field.

    ``intermediate`` and ``experts`` must be the per-GPU shape that was benchmarked
    (vLLM's N and E). Every M with a timed row is a key.

    When rows of one table at one M come from several problems (models with the
    same E and N but another hidden size or top-k, or several routing
    distributions), raw times are not comparable: each config is scored by its
    time over the best time of the same problem, averaged over the problems,
    among the configs measured on the most problems. With one problem this is
    simply the lowest time_us.
    """
    return best_of(timed_rows(df, path))


def best_of(rows: pd.DataFrame) -> dict[tuple, ConfigTable]:
    """``best_configs`` of rows ``timed_rows`` chose."""
    if rows.empty:
        return {}
    problem = [c for c in _PROBLEM if c in rows.columns]
    tables: dict[tuple, dict[int, TileConfig]] = {}
    for key, group in rows.groupby("_table", sort=True):
        per_m = tables.setdefault(key, {})
        for m, at_m in group.groupby("M", sort=True):
            per_m[int(m)] = _pick(at_m, problem)
    return {k: ConfigTable(v) for k, v in tables.items()}


def _pick(at_m: pd.DataFrame, problem: list[str]) -> TileConfig:
    """The config with the best mean time relative to each problem's fastest (see best_configs)."""
    times: dict[tuple, dict[tuple, float]] = {}  # config key -> problem -> its best time there
    tiles: dict[tuple, TileConfig] = {}
    for tile, *prob, t in at_m[["_tile", *problem, "time_us"]].itertuples(index=False, name=None):
        prob_key = tuple(None if pd.isna(v) else v for v in prob)
        per_problem = times.setdefault(tile.key(), {})
        per_problem[prob_key] = min(float(t), per_problem.get(prob_key, math.inf))
        tiles[tile.key()] = tile
    fastest: dict[tuple, float] = {}
    for per_problem in times.values():
        for prob_key, t in per_problem.items():
            fastest[prob_key] = min(t, fastest.get(prob_key, math.inf))
    most = max(len(per_problem) for per_problem in times.values())
    scores = {
        key: sum(t / fastest[p] for p, t in per_problem.items()) / len(per_problem)
        for key, per_problem in times.items()
        if len(per_problem) == most
    }
    return tiles[min(scores, key=lambda key: (scores[key], key))]


def engine_files(
    tables: Mapping[tuple, ConfigTable],
    out_dir: Path,
    layout: str = "vllm",
    tuned_triton: str | None = None,
    engine_triton: str = SGLANG_TRITON,
) -> dict[Path, tuple[tuple, str]]:
    """Where each table goes and its text, nothing written: {path: (table key, text)}.

    Layout "vllm": ``out_dir/<name>`` (``VLLM_TUNED_CONFIG_FOLDER=out_dir``), the text ending in
    ``"triton_version": tuned_triton`` where given. Layout "sglang":
    ``out_dir/configs/triton_<x_y_z>/<name>`` for ``engine_triton``, the Triton the SGLang server runs
    (``SGLANG_MOE_CONFIG_DIR=out_dir``), and no ``triton_version`` entry. Two tables that map to one file
    name (e.g. fp8-tensor and fp8-channel in vLLM's naming) are a UserError.
    """
    _check_layout(layout)
    folder = Path(out_dir)
    if layout == "sglang":
        folder = folder / "configs" / sglang_triton_dir(engine_triton)
    files: dict[Path, tuple[tuple, str]] = {}
    for key, table in tables.items():
        experts, n, dtype, device = key
        path = folder / config_file_name(experts, n, device, dtype, layout=layout)
        if path in files:
            raise UserError(
                f"{files[path][0][2]} and {dtype} tables (E={experts}, N={n}, {device}) "
                f"both map to {path.name}; export them one at a time"
            )
        files[path] = (key, table.to_json(tuned_triton if layout == "vllm" else None))
    return files


def write_tables(
    tables: Mapping[tuple, ConfigTable],
    out_dir: Path,
    layout: str = "vllm",
    tuned_triton: str | None = None,
    engine_triton: str = SGLANG_TRITON,
) -> list[Path]:
    """Write each table where the engine looks for it (``engine_files``); return the written paths.

    Every file is placed and checked before the first is written, and each is written to a temporary
    file and renamed.
    """
    files = engine_files(tables, out_dir, layout, tuned_triton, engine_triton)
    for path, (_, text) in files.items():
        write_text_atomic(path, text)
    return list(files)
