"""A table file of any layout read back: its layout, its configs, and what its name, header or export sidecar say
of its shape.

file -> layout (a moebench header, else an engine's file name: SGLang where the name's spelling or a
``triton_<x_y_z>`` folder says so, else vLLM) -> ConfigTable, E, N, device, dtype, and whether it is SGLang's
table of GEMM2 alone (``_down``) -> hidden size and top-k from the moebench header or from the export's sidecar
(``moebench-export.json`` in a folder above the file) -> the file's text in its own layout again (``text_of``:
an engine's file keeps its keys' order, the entries not replaced as written, its indent and closing newline).
``retime`` and ``export-configs --merge-with`` read tables through here. Nothing here loads torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from moebench.bounded import NotJSON, Refused, parse_json, read_json, read_text
from moebench.errors import UserError
from moebench.tables.engine_entry import read_entry
from moebench.tables.engine_log import parse_log
from moebench.tables.export import SIDECAR
from moebench.tables.formats import FORMATS
from moebench.tables.formats import moebench as moebench_format
from moebench.tables.table import ENGINE_DOWN_PATH, ConfigTable, engine_table

_TRITON_DIR = re.compile(r"triton_\d+_\d+_\d+")
_INDENT = re.compile(r"\s*\{[ \t]*\r?\n([ \t]*)")  # the opening brace, a line break, the first key's indent
NAMES = "an engine's E=..,N=..,device_name=...json or moebench's moebench-tiles_...json"


@dataclass(frozen=True)
class TableFile:
    """One table file: ``layout`` (a name in ``FORMATS``), the configs, the shape its name says (E, N), the
    device and dtype (moebench's name; None where moebench times no such file, ``why`` says so), and hidden
    size and top-k where its header or sidecar has them (None where not). ``tuned``: per M, the times the
    sidecar says each entry was picked with; ``tuned_on``: the sidecar's device, dtype and shape for them.
    ``down``: SGLang's table of GEMM2 alone (a ``_down`` name; SGLang runs GEMM1 from the file without it).
    An engine's file keeps what ``text_of`` writes back: its JSON object as read (``raw``), its indent (None:
    one line) and whether it ends in a newline."""

    path: Path
    layout: str
    table: ConfigTable
    experts: int
    n: int
    device_name: str
    dtype: str | None
    why: str = ""
    hidden: int | None = None
    topk: int | None = None
    model: str | None = None
    sidecar: Path | None = None
    sidecar_key: str | None = None
    tuned: dict[int, dict] = field(default_factory=dict)
    tuned_on: dict = field(default_factory=dict)
    triton_version: str | None = None  # a vLLM file's own "triton_version" entry, kept when it is written again
    header: moebench_format.TableMeta | None = None  # a moebench table's header
    down: bool = False
    raw: dict | None = field(default=None, repr=False)
    indent: str | None = "    "
    newline: bool = True

    @property
    def kernel(self) -> str:
        """The path whose timings the table's configs mean: the engines' form (with the config on GEMM2 alone
        for a ``_down`` table), or moebench's kernel."""
        return ENGINE_DOWN_PATH if self.down else FORMATS[self.layout].PATH

    @property
    def label(self) -> str:
        return f"{self.path.name} ({self.layout})"


def table_files(folder: Path) -> list[Path]:
    """Every table file under ``folder`` (any depth: SGLang keeps its under ``configs/triton_<x_y_z>/``), sorted;
    a UserError where there is none."""
    folder = Path(folder)
    found = sorted(p for p in folder.rglob("*.json") if p.is_file() and _named_table(p.name))
    if not found:
        raise UserError(f"{folder}: no table files in it ({NAMES})")
    return found


def _named_table(name: str) -> bool:
    if name.startswith(f"{moebench_format.FORMAT}_"):
        return True
    try:
        return parse_log(name).name == name
    except UserError:
        return False


def read_table(path: Path) -> TableFile:
    """The table file at ``path``, its layout found from its header or name; a file that is missing, of no
    layout moebench knows, or malformed is a one-line UserError naming it."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such table file")
    try:
        text = read_text(path, gz=False)
        raw = parse_json(text, path)
    except NotJSON:
        raise
    except Refused as e:
        raise UserError(f"{path}: cannot read table ({e.why})") from None
    if isinstance(raw, dict) and "format" in raw:
        return _with_sidecar(_moebench(path))
    try:
        logged = parse_log(path.name)
    except UserError:
        logged = None
    if logged is None or logged.name != path.name:
        raise UserError(f"{path}: unknown layout: not {NAMES}")
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a JSON object keyed by token count M")
    layout = "sglang" if logged.engine == "sglang" or _TRITON_DIR.fullmatch(path.parent.name) else "vllm"
    version = raw.get("triton_version")
    table = engine_table({k: v for k, v in raw.items() if k != "triton_version"}, str(path), layout)
    indent = _INDENT.match(text)
    return _with_sidecar(TableFile(
        path, layout, table, logged.experts, logged.n, logged.device_name, logged.dtype, logged.why,
        triton_version=version if isinstance(version, str) else None, down=logged.down, raw=raw,
        indent=indent.group(1) if indent else None, newline=text.endswith("\n")))


def _moebench(path: Path) -> TableFile:
    meta, table = moebench_format.load_table(path)
    s = meta.shape
    return TableFile(path, "moebench", table, int(s["experts"]), int(s["intermediate"]), meta.device_name,
                     meta.dtype, "the table's header", _one(s["hidden"]), _one(s["topk"]), header=meta)


def _one(v) -> int | None:
    """An int of a header or sidecar's shape; None for a list (a table picked across several shapes)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _with_sidecar(tf: TableFile) -> TableFile:
    """``tf`` with what the export's sidecar above it says of it (shape, model, times), where one lists it."""
    from dataclasses import replace

    for folder in tf.path.parents:
        file = folder / SIDECAR
        if not file.is_file():
            continue
        key = tf.path.relative_to(folder).as_posix()
        try:
            entry = read_json(file, gz=False).get("files", {}).get(key)
        except (UserError, AttributeError):
            entry = None
        if not isinstance(entry, dict):
            continue
        shape = entry.get("shape") or {}
        models = entry.get("models") or []
        times = {int(m): t for m, t in (entry.get("times") or {}).items() if isinstance(t, dict)}
        return replace(tf, hidden=tf.hidden or _one(shape.get("hidden")), topk=tf.topk or _one(shape.get("topk")),
                       model=models[0] if len(models) == 1 else None, sidecar=file, sidecar_key=key, tuned=times,
                       tuned_on={"device_name": entry.get("device_name"), "dtype": entry.get("dtype"),
                                 "hidden": _one(shape.get("hidden")), "topk": _one(shape.get("topk")),
                                 "triton_version": entry.get("triton_version")})
    return tf


def same_name(tf: TableFile, dtype: str) -> bool:
    """Whether ``dtype`` is one the file stands for: its layout names a file of that dtype as this one is named
    (vLLM and SGLang name bf16 and fp16 alike; vLLM fp8 per tensor and per channel alike)."""
    if tf.layout == "moebench":
        return dtype == tf.dtype
    name = FORMATS[tf.layout].file_name(tf.experts, tf.n, tf.device_name, dtype)
    return (name.removesuffix(".json") + "_down.json" if tf.down else name) == tf.path.name


def text_of(tf: TableFile, table: ConfigTable) -> str:
    """``table`` as the text of ``tf``'s file in its layout: a moebench table with its header; an engine's file
    as it was read where ``table`` keeps it (its keys in the file's order, a ``triton_version`` where it stood,
    each entry ``table`` holds unchanged as the file wrote it, its indent and closing newline), an entry
    replaced written as ``ConfigTable.entry`` gives it, a key new to the file last."""
    if tf.layout == "moebench":
        return moebench_format.table_text(tf.header, table)
    if tf.raw is None:
        return table.to_json(tf.triton_version if tf.layout == "vllm" else None)
    out: dict = {}
    for key, value in tf.raw.items():
        if key == "triton_version":
            out[key] = value
            continue
        m = int(key)
        if m in table:
            kept = read_entry(value, tf.layout) == (table[m], table.extras.get(m, {}))
            out[key] = value if kept else table.entry(m)
    written = {int(k) for k in out if k != "triton_version"}
    out.update({str(m): table.entry(m) for m in table.order if m not in written})
    return json.dumps(out, indent=tf.indent) + ("\n" if tf.newline else "")
