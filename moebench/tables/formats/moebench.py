"""moebench's own tile tables: the best config of moebench's kernel (path "triton") per M, every tile field kept.

The engines' files hold six fields and nothing about where they came from; these files hold every
``TileConfig`` field and their provenance, in a versioned format of our own (``FORMAT``, ``VERSION``):

    {"format": "moebench-tiles", "version": 1, "kernel": "triton",
     "device_name", "triton_version", "torch_version", "created" (UTC), "commit", "source_run" (from the file's
     folder, ``runfolder.run_ref``),
     "shape": {"experts", "intermediate", "hidden", "topk"}, "dtype",
     "configs": {"<M>": {every TileConfig field}}}

One file per (experts, intermediate, dtype, device), named by ``file_name``:
``moebench-tiles_E=8,N=14336,device_name=NVIDIA_H200,dtype=bf16.json``. The prefix says what the file is
and keeps it apart from any name an engine looks up; the dtype is moebench's name (fp8 schemes apart).
``hidden`` and ``topk`` are lists where one table was picked across several shapes with the same E and N.
``load_table`` refuses another format or a version it cannot read, and warns on a newer version. The reader is
``moebench.tables.lookup``: ``--configs DIR``, then ``$MOEBENCH_CONFIGS``, then the shipped tables.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from moebench.bounded import NotJSON, Refused, read_json
from moebench.errors import UserError
from moebench.tables.table import ConfigTable, Provenance, entries_from_json

READER = "moebench"  # who reads these files, for messages
PATH = "triton"  # the path whose rows pick the configs (the header's "kernel")
ENV_VAR = None  # the export prints no line: the lookup is pointed at a folder by --configs or $MOEBENCH_CONFIGS
ENGINE_TRITON = None  # the folder does not depend on a serving engine's Triton
HINT = "tune with `moebench tune --path triton`"
FORMAT = "moebench-tiles"
VERSION = 1
_SHAPE_KEYS = ("experts", "intermediate", "hidden", "topk")


def folder(out_dir: Path, engine_triton: str | None) -> Path:
    """Where under the export's folder the files go: the folder itself."""
    return Path(out_dir)


def file_name(experts: int, n: int, device_name: str, dtype: str) -> str:
    """The file name of moebench's table for E experts, per-GPU intermediate size N, a device and a dtype."""
    from moebench.dtypes import get_dtype  # loads torch: not at import, so `--help` stays light

    get_dtype(dtype)  # an unknown dtype is a UserError here, not a file of a name nothing reads
    return f"{FORMAT}_E={experts},N={n},device_name={device_name.replace(' ', '_')},dtype={dtype}.json"


@dataclass(frozen=True)
class TableMeta:
    """What a table file says besides its configs; ``warning`` is set where the file's version is newer."""

    device_name: str
    dtype: str
    shape: dict  # experts, intermediate, hidden, topk (hidden and topk: an int, or a list of ints)
    triton_version: str | None = None
    torch_version: str | None = None
    created: str | None = None  # UTC, ISO 8601
    commit: str | None = None
    source_run: str | None = None
    kernel: str = PATH
    version: int = VERSION
    warning: str | None = None

    def __post_init__(self) -> None:
        missing = [k for k in _SHAPE_KEYS if k not in self.shape]
        if missing:
            raise UserError(f"moebench table: shape lacks {missing[0]!r}")


def file_text(key: tuple, table: ConfigTable, shape: dict, made: Provenance) -> str:
    """The file's text for the table of ``key`` (experts, intermediate, dtype, device_name): the header (``shape``
    and ``made``), then the configs."""
    _, _, dtype, device = key
    return table_text(TableMeta(device_name=device, dtype=dtype, shape=shape, **asdict(made)), table)


def table_text(meta: TableMeta, table: ConfigTable) -> str:
    """The file's text: the header, then the configs in ascending M with every field."""
    payload = {
        "format": FORMAT, "version": VERSION, "kernel": meta.kernel,
        "device_name": meta.device_name, "triton_version": meta.triton_version,
        "torch_version": meta.torch_version, "created": meta.created, "commit": meta.commit,
        "source_run": meta.source_run, "shape": {k: meta.shape[k] for k in _SHAPE_KEYS}, "dtype": meta.dtype,
        "configs": {str(m): cfg.as_dict() for m, cfg in table.items()},
    }
    return json.dumps(payload, indent=2) + "\n"


def load_table(path: Path | str) -> tuple[TableMeta, ConfigTable]:
    """(meta, table) of a moebench table file. Another format, a version it cannot read, or a malformed
    file is a one-line UserError naming the file; a newer version reads with ``meta.warning`` set."""
    name = str(path)
    try:
        raw = read_json(path, gz=False)
    except NotJSON:
        raise
    except Refused as e:
        raise UserError(f"{name}: cannot read table ({e.why})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else None
        what = f"format {found!r}" if found is not None else "no format field (an engine's file?)"
        raise UserError(f"{name}: not a {FORMAT} table ({what})")
    version = raw.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise UserError(f"{name}: {FORMAT} version {version!r} is not one this moebench reads ({VERSION})")
    warning = None
    if version > VERSION:
        warning = f"warning: {name} is {FORMAT} version {version}, this moebench reads {VERSION}; fields may differ"
    configs, shape = raw.get("configs"), raw.get("shape")
    if not isinstance(configs, dict) or not isinstance(shape, dict):
        raise UserError(f"{name}: a {FORMAT} table needs a 'configs' and a 'shape' object")
    try:
        meta = TableMeta(
            device_name=str(raw.get("device_name", "")), dtype=str(raw.get("dtype", "")), shape=shape,
            triton_version=raw.get("triton_version"), torch_version=raw.get("torch_version"),
            created=raw.get("created"), commit=raw.get("commit"), source_run=raw.get("source_run"),
            kernel=str(raw.get("kernel", PATH)), version=version, warning=warning,
        )
    except UserError as e:
        raise UserError(f"{name}: {e}") from None
    try:
        entries = entries_from_json(configs, name)
    except UserError as e:
        if version > VERSION:  # a field this moebench does not know, most likely
            raise UserError(f"{e} ({FORMAT} version {version}, newer than this moebench's {VERSION})") from None
        raise
    return meta, ConfigTable(entries)
