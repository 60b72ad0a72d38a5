"""``moebench doctor``: which tuned config file each engine looks up for a shape, where it looks, what it finds.

(experts, N, device, dtype) -> each format's ``file_name`` -> the engine's places, in its order -> the first file
found -> per serving M, the key the nearest-M rule reads and whether that key was tuned -> the command that makes
the file.

The places follow each reader's own lookup (``formats/*.py`` say what they read): vLLM reads
``$VLLM_TUNED_CONFIG_FOLDER`` and then its package's ``fused_moe/configs/``; SGLang reads
``configs/triton_<x_y_z>/`` under ``$SGLANG_MOE_CONFIG_DIR`` (which replaces its package folder, not adds to it)
for the Triton it runs, then every other ``triton_*`` folder there, newest first; moebench reads
``$MOEBENCH_CONFIGS``, then its shipped tables (``tables.lookup``). An engine's package folder is looked at where
the engine is importable (``importlib.util.find_spec``: located, not imported). Nothing here loads torch.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from moebench.tables import lookup
from moebench.tables.engine_entry import carried_note
from moebench.tables.formats import FORMATS
from moebench.tables.formats import sglang as sglang_format
from moebench.tables.table import ConfigTable

# Where each engine keeps its own config files inside its package (SGLang moved its folder; newest first).
VLLM_DIR = ("model_executor", "layers", "fused_moe", "configs")
SGLANG_DIRS = (("srt", "layers", "moe", "moe_runner", "triton_utils"), ("srt", "layers", "moe", "fused_moe_triton"))
TUNE_OUT = "results/tunes"  # where the printed command's tune puts its run folder, for the export to find it


@dataclass(frozen=True)
class Place:
    """One place an engine looks for the file: ``path`` the file there (or, where ``looked`` is False, what it
    would be); ``found`` whether a file is there; ``note`` why it is not looked at, or what is wrong there."""

    label: str
    path: str
    looked: bool = True
    found: bool = False
    note: str = ""
    fails: bool = False  # the engine raises here (SGLang's fallback scan of a folder it cannot list or read)


@dataclass(frozen=True)
class Pick:
    """At ``m`` tokens: the key of the file the nearest-M rule reads (None: no file, the engine's default)."""

    m: int
    key: int | None

    @property
    def tuned(self) -> bool:
        """True where the file holds a config tuned at exactly this M; False where M falls between its keys."""
        return self.key == self.m


@dataclass(frozen=True)
class Finding:
    """What one engine does for one shape: the file name, its places in order, the file it reads (the first
    found, or None), the key read per M, the command that makes the file, and notes."""

    engine: str
    reader: str
    file_name: str
    places: tuple[Place, ...]
    read: str | None
    picks: tuple[Pick, ...]
    command: str | None
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        """The finding as plain JSON-able data (``--format json``)."""
        return {
            "engine": self.engine, "reader": self.reader, "file_name": self.file_name,
            "places": [vars(p) for p in self.places], "read": self.read,
            "picks": [{"m": p.m, "key": p.key, "tuned": p.tuned} for p in self.picks],
            "command": self.command, "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Ask:
    """What doctor is asked: the kernel shape (local experts, per-GPU intermediate size N), the device, the
    moebench dtype (None where a log names a file moebench cannot tune), the serving M, the Triton release the
    SGLang server runs (None: the one installed here), the ``moebench tune`` flags naming the shape (None where
    unknown), and file names given by a log per engine (used as they are)."""

    experts: int
    n: int
    device_name: str
    dtype: str | None
    ms: tuple[int, ...]
    engine_triton: str | None = None
    shape_flags: str | None = None
    names: dict = field(default_factory=dict)
    log_dirs: tuple[str, ...] = ()  # folders the log says the engine looked in
    triton_source: str = "--engine-triton"  # where engine_triton came from, for the note
    engine_experts: dict = field(default_factory=dict)  # per engine, the experts its kernel sees where not E
    engine_flags: dict = field(default_factory=dict)  # per engine, more `moebench tune` flags for that form
    engine_notes: dict = field(default_factory=dict)  # per engine, a line on how it serves the shape
    log_used: str | None = None  # the file the log says the engine read


def diagnose(ask: Ask, engines: tuple[str, ...] = tuple(FORMATS)) -> list[Finding]:
    """One Finding per engine of ``engines`` (names of ``FORMATS``), in that order."""
    return [_finding(ask, engine) for engine in engines]


def _finding(ask: Ask, engine: str) -> Finding:
    fmt = FORMATS[engine]
    notes: list[str] = [ask.engine_notes[engine]] if ask.engine_notes.get(engine) else []
    experts = ask.engine_experts.get(engine, ask.experts)
    name = ask.names.get(engine) or fmt.file_name(experts, ask.n, ask.device_name, ask.dtype)
    triton = None
    if engine == "sglang":
        triton, why = server_triton(ask.engine_triton, ask.triton_source)
        notes.append(f"SGLang's folder is named by the Triton its server runs: {triton} ({why})")
    places = SEARCHES[engine](name, triton, notes)
    places += [_log_place(d, name) for d in ask.log_dirs if not any(p.path == str(Path(d) / name) for p in places)]
    found = next((i for i, p in enumerate(places) if p.found), None)
    fails = next((p for p in places[:found] if p.fails), None)
    read = None if found is None or fails is not None else places[found].path
    picks: tuple[Pick, ...] = () if read is not None else tuple(Pick(m, None) for m in ask.ms)
    if fails is not None:
        notes.append(f"{fmt.READER} raises at this lookup ({fails.path}): the server fails, it does not run a "
                     "default")
    elif read is not None:
        table, problem = _read(engine, Path(read))
        if problem:
            notes.append(problem)
        if table is not None:
            picks = tuple(Pick(m, table.nearest_key(m)) for m in ask.ms)
            notes += _staleness(engine, Path(read), ask, triton)
    elif ask.log_used is not None:
        notes.append(f"the log says {fmt.READER} read {ask.log_used}, not on this machine: the server runs that "
                     "table, not its default")
    elif any(not p.looked and p.note.endswith("not installed here") for p in places):
        notes.append(_not_looked(engine, name))
    else:
        default = ("the config fitted from its other tables of the device, else its built-in heuristic,"
                   if engine == "moebench" else "its default config")
        notes.append(f"no file found: {fmt.READER} runs {default} at every M")
    command = make_command(ask, engine, triton, notes)
    return Finding(engine, fmt.READER, name, tuple(places), read, picks, command, tuple(notes))


def _not_looked(engine: str, name: str) -> str:
    """What is known of a file in an engine's own folder, the engine not installed here."""
    from moebench.tables.shipped_names import RELEASES, ships

    reader = FORMATS[engine].READER
    line = f"not looked: {reader} is not installed here, so its own folder is not known"
    if ships(engine, name):
        return f"{line}; {RELEASES[engine]} ships {name}: a server of that release reads its own file"
    return (f"{line}; moebench's list of {RELEASES.get(engine, reader)}'s shipped files does not name it, which "
            "does not say it is not shipped")


def _staleness(engine: str, path: Path, ask: Ask, triton: str | None) -> list[str]:
    """The Triton the found table was tuned with (its own entry, or its export's sidecar), and `moebench retime`
    where that differs from the server's."""
    if engine == "moebench":
        return []
    from moebench.errors import UserError
    from moebench.tables.files import read_table

    try:
        tf = read_table(path)
    except UserError:
        return []
    tuned = tf.triton_version or tf.tuned_on.get("triton_version")
    if not tuned:
        return ["the file says nothing of the Triton it was tuned with (no triton_version, no export sidecar)"]
    server = triton or ask.engine_triton
    if server is None:
        return [f"tuned with Triton {tuned}; --engine-triton names the server's, to set it against"]
    if str(tuned).split("+")[0] == server:
        return [f"tuned with Triton {tuned}, the server's"]
    flags = f" {ask.shape_flags}" if ask.shape_flags else ""
    return [f"tuned with Triton {tuned}, the server runs {server}: `moebench retime {shlex.quote(str(path))}"
            f"{flags}` on the server's GPU times each entry against the default under its Triton"]


# ---- each engine's places, in its order ----

def _file(label: str, folder: Path, name: str, note: str = "") -> Place:
    path = folder / name
    return Place(label, str(path), True, path.is_file(), note)


def _log_place(folder: str, name: str) -> Place:
    path = Path(folder) / name
    if Path(folder).is_dir():
        return Place("named in the log", str(path), True, path.is_file())
    return Place("named in the log", str(path), False, note="not on this machine")


def package_dir(module: str) -> Path | None:
    """The folder of an importable top-level package, located without importing it; None where it is not there."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _vllm(name: str, triton: str | None, notes: list[str]) -> list[Place]:
    places = []
    env = os.environ.get("VLLM_TUNED_CONFIG_FOLDER")
    if env is None:
        places.append(Place("$VLLM_TUNED_CONFIG_FOLDER", "", False, note="not set"))
    else:
        places.append(_file("$VLLM_TUNED_CONFIG_FOLDER", Path(env), name))
    pkg = package_dir("vllm")
    rel = Path("vllm", *VLLM_DIR, name)
    if pkg is None:
        places.append(Place("vLLM's own configs/", str(rel), False, note="vLLM is not installed here"))
    else:
        places.append(_file("vLLM's own configs/", pkg.joinpath(*VLLM_DIR), name))
    return places


def _sglang_base() -> tuple[Path | None, str, str]:
    """(folder holding configs/, its label, why not) as SGLang chooses it: $SGLANG_MOE_CONFIG_DIR where set and
    not empty, else its package folder."""
    env = os.environ.get(sglang_format.ENV_VAR)
    if env == "":
        return Path(), f"${sglang_format.ENV_VAR} (empty: the current folder)", ""  # SGLang joins "" and "configs"
    if env:
        return Path(env), f"${sglang_format.ENV_VAR}", ""
    pkg = package_dir("sglang")
    if pkg is None:
        return None, "SGLang's own folder", "SGLang is not installed here"
    dirs = [pkg.joinpath(*d) for d in SGLANG_DIRS]
    return next((d for d in dirs if (d / "configs").is_dir()), dirs[0]), "SGLang's own folder", ""


def _sglang(name: str, triton: str | None, notes: list[str]) -> list[Place]:
    base, label, why_not = _sglang_base()
    exact = sglang_format.triton_dir(triton)
    places = []
    if label.startswith("$"):
        notes.append(f"${sglang_format.ENV_VAR} replaces SGLang's own folder: its shipped files are not read")
    else:
        places.append(Place(f"${sglang_format.ENV_VAR}", "", False, note="not set: SGLang reads its own folder"))
    if base is None:
        rel = Path("sglang", *SGLANG_DIRS[0], "configs", exact, name)
        return [*places, Place(f"{label}, configs/{exact}", str(rel), False, note=why_not)]
    places.append(_file(f"{label}, configs/{exact}", base / "configs" / exact, name))
    root = base / "configs"
    if places[-1].found:
        return places  # the fallback scan runs only where the exact folder lacks the file
    if not root.is_dir():
        notes.append(f"{root} does not exist: SGLang lists it for other Triton folders and fails")
        return [*places, Place(f"{label}, the fallback scan of configs/", str(root), True, False,
                               "does not exist: listing it raises", fails=True)]
    versions = []
    for d in root.iterdir():
        if d.name.startswith("triton_"):
            try:
                versions.append((tuple(int(x) for x in d.name.removeprefix("triton_").split("_")), d))
            except ValueError:
                notes.append(f"{d} does not read as triton_<x_y_z>: SGLang's fallback scan fails on it")
                return [*places, Place(f"{label}, the fallback scan of configs/", str(d), True, False,
                                       "not triton_<x_y_z> as integers: reading it raises", fails=True)]
    for _, d in sorted(versions, reverse=True):
        if d.name != exact:
            places.append(_file(f"{label}, fallback configs/{d.name}", d, name))
    return places


def _moebench(name: str, triton: str | None, notes: list[str]) -> list[Place]:
    places = []
    if lookup.ENV_VAR not in os.environ:
        places.append(Place(f"${lookup.ENV_VAR}", "", False, note="not set"))
    for source, folder in lookup.table_dirs():
        label = f"${lookup.ENV_VAR}" if source == "env" else "moebench's shipped tables"
        places.append(_file(label, folder, name))
    return places


# Each engine's places, by the name of its format in FORMATS.
SEARCHES: dict[str, Callable[[str, str | None, list[str]], list[Place]]] = {
    "vllm": _vllm, "sglang": _sglang, "moebench": _moebench,
}


def server_triton(given: str | None, source: str = "--engine-triton") -> tuple[str, str]:
    """(release, why) of the Triton the SGLang server runs: ``given``, else the engine's own (``ENGINE_TRITON``,
    the default of ``export-configs --layout sglang`` too: one default for both)."""
    if given:
        sglang_format.triton_dir(given)  # a release SGLang cannot read back is a UserError
        return given, source
    return sglang_format.ENGINE_TRITON, ("SGLang 0.5.23's, the export's default too; --engine-triton names the "
                                         "server's")


def _read(engine: str, path: Path) -> tuple[ConfigTable | None, str]:
    """The table in ``path`` as the engine reads it, and what is wrong with it for that engine (or "")."""
    from moebench.bounded import read_json
    from moebench.errors import UserError

    try:
        if engine == "moebench":
            from moebench.tables.formats.moebench import load_table

            return load_table(path)[1], ""
        table = ConfigTable.from_json(path)
    except UserError as e:
        return None, f"{FORMATS[engine].READER} cannot use the file found: {e}"
    if engine == "sglang" and "triton_version" in read_json(path, gz=False):
        return table, ("the file has a \"triton_version\" entry, which SGLang reads as a token count and fails on "
                       "(a vLLM file? export it with --layout sglang)")
    return table, carried_note(table.extras, engine, FORMATS[engine].READER) or ""


# ---- the command that makes the file ----

def make_command(ask: Ask, engine: str, triton: str | None, notes: list[str]) -> str | None:
    """``moebench tune ... && moebench export-configs ...`` writing this engine's file, or None (with a note)
    where the shape's flags or a dtype moebench tunes are unknown."""
    fmt = FORMATS[engine]
    if ask.dtype is None:
        notes.append("moebench tunes no such dtype: no command makes this file")
        return None
    if ask.shape_flags is None:
        notes.append(f"no preset has E={ask.experts},N={ask.n}: give doctor the model (--model, --hf-config or "
                     "--experts/--hidden/--intermediate) for the command that makes the file")
        return None
    made = fmt.file_name(ask.engine_experts.get(engine, ask.experts), ask.n, ask.device_name, ask.dtype)
    wanted = ask.names.get(engine)
    if wanted and made != wanted:
        notes.append(f"the export writes {made}, not {wanted}: tune on the device the log names")
    export = ["moebench", "export-configs", f'"$(ls -td {TUNE_OUT}/*/ | head -1)"', "--layout", engine]
    if triton is not None:
        export += ["--engine-triton", triton]
    env = os.environ.get(fmt.ENV_VAR) if fmt.ENV_VAR else os.environ.get(lookup.ENV_VAR)
    if env:
        export += ["--out", shlex.quote(env)]
    elif engine == "sglang":
        notes.append(f"pointing ${fmt.ENV_VAR} at the export hides SGLang's own files: or copy the file into "
                     f"configs/{sglang_format.triton_dir(triton)}/ of SGLang's own folder")
    elif engine == "moebench":
        notes.append(f"moebench reads the export where ${lookup.ENV_VAR} or --configs names its folder")
    notes.append(f"run the command on the {ask.device_name}: the export names the file by the GPU the tune ran on")
    more = f" {ask.engine_flags[engine]}" if ask.engine_flags.get(engine) else ""
    tune = f"moebench tune {ask.shape_flags}{more} --dtype {ask.dtype} --path {fmt.PATH} --out {TUNE_OUT}"
    return f"{tune} && {' '.join(export)}"


def tune_flags(model: str | None = None, hf_config: str | None = None, experts: int | None = None,
               hidden: int | None = None, intermediate: int | None = None, topk: int | None = None,
               tp: int = 1, ep: int = 1) -> str:
    """The ``moebench tune`` flags naming a shape as it was given (a preset, a config.json, or explicit sizes)."""
    words: list[str] = []
    if model is not None:
        words += ["--model", model]
    elif hf_config is not None:
        words += ["--hf-config", str(hf_config)]
    else:
        words += ["--experts", str(experts), "--hidden", str(hidden), "--intermediate", str(intermediate)]
    if topk is not None:
        words += ["--topk", str(topk)]
    for flag, n in (("--tp", tp), ("--ep", ep)):
        if n != 1:
            words += [flag, str(n)]
    return " ".join(shlex.quote(w) for w in words)
