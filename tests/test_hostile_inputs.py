"""Hostile inputs, every command: each is refused with exit status 2 and one short line on stderr, no traceback,
no hang, nothing written anywhere (the folder the command runs in, ``--out`` inside it, is as it was) and, where
an input could exhaust memory, little of it allocated.

The battery is built from two small tables: the kinds of bad content (``JSON_KINDS``, ``YAML_KINDS``, ``ROW_KINDS``:
each says why it exists) and the places a command reads a user's file (``JSON_ROLES``...: a command line with the
file in it). Every kind goes into every role of its format; the commands' own bad values (``VALUE_CASES``) and the
names that would become path parts (``NAME_CASES``) come after. The real commands run in this process through
their entry point (``helpers.moebench_in_process``)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import moebench_in_process

from moebench import bounded

DATA = Path(__file__).resolve().parent / "data"
QUICK = DATA / "h200-quick"  # a GPU sweep's run folder
HANG_S = 5  # a refusal that takes longer hung (each case runs in well under a second)
PEAK_BYTES = 2 * bounded.MAX_BYTES  # what reading a bomb may hold at most: the bound, and the parser's copy
LINE_MAX = 400  # an error line: two paths of a temporary folder and a short quote fit


class Hung(BaseException):
    """Raised by the alarm: no ``except Exception`` (nor the CLI's ``except OSError``) catches it."""


# ---- kinds of bad content ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kind:
    name: str
    why: str  # what the reader did before it was bounded
    write: Callable[[Path], None]  # makes the bad file at the path given
    memory: bool = False  # a few bytes that could expand: the peak allocation is measured


def _text(text: str | bytes) -> Callable[[Path], None]:
    return lambda p: p.write_bytes(text if isinstance(text, bytes) else text.encode())


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _device(p: Path) -> None:
    p.symlink_to("/dev/zero")


def _folder(p: Path) -> None:
    p.mkdir()


def _sparse(p: Path) -> None:
    with open(p, "wb") as f:
        f.truncate(bounded.MAX_BYTES + 1)  # a file past the bound, no disk used


def _bomb(p: Path) -> None:
    p.write_bytes(gzip.compress(b"\n" * (bounded.MAX_BYTES + (8 << 20)), 9))  # about 70 KB on disk


DEEP = 100_000  # far past Python's recursion limit: json and yaml raised RecursionError
FILE_KINDS = (  # whatever the format: what the file is, not what it holds
    Kind("fifo", "open() of a FIFO blocks until a writer comes: a hang", _fifo),
    Kind("device", "/dev/zero never ends: read() filled memory", _device),
    Kind("folder", "a folder where a file is expected: IsADirectoryError", _folder),
    Kind("huge", "a file past the size bound was read whole", _sparse, memory=True),
    Kind("not-utf8", "bytes that are no UTF-8 text", _text(b"\xff\xfe\x00\x81garbage")),
    Kind("empty", "an empty file", _text("")),
)
JSON_KINDS = FILE_KINDS + (
    Kind("deep-array", "RecursionError in json", _text("[" * DEEP + "]" * DEEP)),
    Kind("deep-object", "RecursionError in json", _text('{"a":' * DEEP + "1" + "}" * DEEP)),
    Kind("nested-40", "deep enough to break code that walks it, shallow enough for json", _text("[" * 40 + "]" * 40)),
    Kind("digits", "ValueError past Python's 4300-digit int limit", _text('{"1": ' + "9" * 5000 + "}")),
    Kind("digits-41", "an integer no size holds", _text('{"1": ' + "9" * 41 + "}")),
    Kind("nan", "NaN is no JSON number but Python reads it", _text('{"1": NaN}')),
    Kind("infinity", "Infinity read as a float: OverflowError in int()", _text('{"1": {"BLOCK_SIZE_M": Infinity}}')),
    Kind("overflow", "1e999 reads as inf", _text('{"1": 1e999}')),
    Kind("syntax", "not JSON", _text('{"1": ')),
    Kind("long-key", "an error echoed a 5,000-character key", _text(json.dumps({"k" * 5000: 1}))),
    Kind("long-string", "an error echoed a 5,000-character value", _text(json.dumps(["v" * 5000]))),
    Kind("array", "JSON, but not an object", _text("[1, 2, 3]")),
    Kind("null", "JSON null", _text("null")),
)
ALIAS_CHAIN = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))  # 9**9 items from ~520 B
YAML_KINDS = FILE_KINDS + (
    Kind("alias-chain", "a 520-byte alias chain expanded to gigabytes to format its error", _text(ALIAS_CHAIN),
         memory=True),
    Kind("alias", "an alias: refused whatever it points at", _text("name: &n t\nmodels: [tiny]\nm: [*n]\n")),
    Kind("deep", "RecursionError in yaml's composer", _text("m: " + "[" * DEEP + "]" * DEEP + "\n")),
    Kind("digits", "ValueError past Python's 4300-digit int limit", _text("seed: " + "9" * 5000 + "\n")),
    Kind("sexagesimal", "a base-60 int of 50,000 parts: quadratic big-int work",
         _text("seed: " + "1:" * 50000 + "1\n")),
    Kind("nan", "a non-finite m", _text("models: [tiny]\nm: [.nan]\n")),
    Kind("bad-date", "a date out of range raised ValueError in the constructor",
         _text("models: [tiny]\nm: 2020-02-31\n")),
    Kind("long-key", "an error echoed a 5,000-character key", _text("k" * 5000 + ": 1\n")),
    Kind("long-model", "an error echoed a 5,000-character name", _text("models: [" + "x" * 5000 + "]\nm: [1]\n")),
    Kind("syntax", "malformed YAML", _text("models: [tiny\nm: [1]\n")),
    Kind("scalar", "YAML, but not a mapping", _text("just text\n")),
    Kind("float-size", "experts: 8.5 was cut to 8", _text(
        "shapes: [{experts: 8.5, hidden: 128, intermediate: 64, topk: 2}]\nm: [1]\npaths: [torch]\n")),
    Kind("huge-size", "hidden 2**40: an allocation of terabytes", _text(
        f"shapes: [{{experts: 8, hidden: {2**40}, intermediate: 64, topk: 2}}]\nm: [1]\npaths: [torch]\n")),
    Kind("huge-layers", "moe_layers 10**9", _text(
        f"shapes: [{{experts: 8, hidden: 128, intermediate: 64, topk: 2, moe_layers: {10**9}}}]\nm: [1]\n")),
    Kind("float-m", "m: [1.5] was cut to 1", _text("models: [tiny]\nm: [1.5]\npaths: [torch]\n")),
    Kind("huge-m", "m of 10**12 tokens", _text(f"models: [tiny]\nm: [{10**12}]\npaths: [torch]\n")),
    Kind("slash-name", "a shape's name with '/' became a tune folder outside --out", _text(
        "shapes: [{name: ../../escaped, experts: 8, hidden: 128, intermediate: 64, topk: 2}]\nm: [1]\n"
        "paths: [triton]\ntune: true\n")),
    Kind("dots-name", "a sweep name of '..'", _text("name: ..\nmodels: [tiny]\nm: [1]\n")),
)
CONFIG = {"hidden_size": 128, "intermediate_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2,
          "num_hidden_layers": 2}
CONFIG_KINDS = (  # a Hugging Face config.json whose values are bad
    Kind("float-experts", "num_local_experts 8.5 was cut to 8",
         _text(json.dumps({**CONFIG, "num_local_experts": 8.5}))),
    Kind("layers-1e9", "num_hidden_layers 10**9: counting its layers hung", _text(
        json.dumps({**CONFIG, "num_hidden_layers": 10**9}))),
    Kind("huge-hidden", "hidden_size 2**40", _text(json.dumps({**CONFIG, "hidden_size": 2**40}))),
    Kind("dots-name", "a model named '..' ends a run folder's name",
         _text(json.dumps({**CONFIG, "_name_or_path": ".."}))),
    Kind("nul-name", "a NUL in a name: ValueError from the file system", _text(
        json.dumps({**CONFIG, "_name_or_path": "org/a\u0000b"}))),
    Kind("long-name", "a 5,000-character model name", _text(json.dumps({**CONFIG, "_name_or_path": "m" * 5000}))),
    Kind("mlp-only-list", "100,000 mlp_only_layers, each looked up in a list per layer: 4*10**8 steps", _text(
        json.dumps({**CONFIG, "num_hidden_layers": 4000, "mlp_only_layers": list(range(10**5))}))),
)


def _row(**over) -> str:
    first = json.loads((QUICK / "rows.jsonl").read_text().splitlines()[0])
    return json.dumps({**first, **over}) + "\n"


ROW_KINDS = (  # a run folder's rows.jsonl (or its gzip)
    Kind("gzip-bomb", "a few-KB rows.jsonl.gz decompressed whole (gigabytes for a few MB)", _bomb, memory=True),
    Kind("deep-row", "RecursionError in json", _text(_row() + "[" * DEEP + "]" * DEEP + "\n")),
    Kind("digits-row", "ValueError past the digit limit", _text(_row() + '{"M": ' + "9" * 5000 + "}\n")),
    Kind("nan-row", "NaN read as a time", _text(_row() + _row().replace('"time_us": 202', '"time_us": NaN, "x": 2'))),
    Kind("slash-model", "a model name with '/' became a path part", _text(_row(model="../../escaped"))),
    Kind("slash-device", "a device name with '/' became an export's file name", _text(_row(device_name="../../x"))),
    Kind("not-utf8-row", "bytes that are no UTF-8", _text(_row().encode() + b"\xff\xfe\n")),
)


# ---- where commands read a user's file ---------------------------------------------------------------------

def _table_args(f: str) -> tuple[str, ...]:
    return ("retime", f, "--model", "tiny", "--out", "out")


JSON_ROLES = {  # role -> (file name, command line with {f} for the file)
    "sweep-hf-config": ("config.json", ("sweep", "--hf-config", "{f}", "--m", "1", "--path", "torch", "--out", "out",
                                        "--no-progress")),
    "tune-hf-config": ("config.json", ("tune", "--hf-config", "{f}", "--m", "1", "--out", "out", "--no-progress")),
    "doctor-hf-config": ("config.json", ("doctor", "--hf-config", "{f}", "--dtype", "fp16")),
    "warmup-hf-config": ("config.json", ("warmup", "--hf-config", "{f}", "--dtype", "fp16", "--no-progress")),
    "trace-hf-config": ("config.json", ("trace", "--hf-config", "{f}", "--out", "out", "--no-progress")),
    "step-hf-config": ("config.json", ("step", "--hf-config", "{f}", "--path", "torch", "--prompt", "8", "--batch",
                                       "1", "--context", "16", "--out", "out", "--no-progress")),
    "retime-table": ("E=8,N=64,device_name=NVIDIA_H200.json", _table_args("{f}")),
    "warmup-table": ("moebench-tiles_E=8,N=64,device_name=cpu,dtype=fp16.json",
                     ("warmup", "--table", "{f}", "--no-progress")),
    "merge-with": ("E=8,N=14336,device_name=NVIDIA_H200.json",
                   ("export-configs", str(QUICK), "--layout", "moebench", "--merge-with", "{f}", "--out", "out",
                    "--runs", "out")),
    "fit-time-points": ("points.json", ("fit-time", "{f}", "--out", "out", "--no-progress")),
    "report-meta": ("meta.json", ("report", "RUN")),
    "plot-meta": ("meta.json", ("plot", "RUN", "--out", "out")),
    "compare-meta": ("meta.json", ("compare", "RUN", str(QUICK))),
    "bounds-meta": ("meta.json", ("bounds", "RUN", "--out", "out", "--no-progress")),
    "export-meta": ("meta.json", ("export-configs", "RUN", "--layout", "moebench", "--out", "out")),
    "trace-configs-table": ("TINY_TABLE", ("trace", "--configs", "{d}", "--requests", "2", "--out", "out",
                                           "--no-progress")),
}
TEXT_ROLES = {  # files read as text, line by line
    "peer": ("peer.jsonl", ("report", str(QUICK), "--peer", "{f}")),
    "tune-m-weights": ("weights.txt", ("tune", "--model", "tiny", "--m-weights", "{f}", "--out", "out",
                                       "--no-progress")),
    "doctor-m-weights": ("weights.txt", ("doctor", "--model", "tiny", "--dtype", "fp16", "--m-weights", "{f}")),
    "trace-csv": ("prompts.csv", ("trace", "--csv", "{f}", "--out", "out", "--no-progress")),
}
YAML_ROLES = {"sweep-spec": ("spec.yaml", ("sweep", "{f}", "--out", "out", "--no-progress")),
              "step-spec": ("spec.yaml", ("step", "{f}", "--out", "out", "--no-progress"))}
ROWS_ROLES = {  # the rows of a run folder (RUN), under the file name the kind's writer needs
    "report-rows": ("report", "RUN"),
    "plot-rows": ("plot", "RUN", "--out", "out"),
    "compare-rows": ("compare", str(QUICK), "RUN"),
    "export-rows": ("export-configs", "RUN", "--layout", "moebench", "--out", "out"),
}
TEXT_KINDS = tuple(k for k in JSON_KINDS if k.name in (
    "fifo", "device", "folder", "huge", "not-utf8", "empty", "long-string", "syntax"))
META_ROLES = {r for r in JSON_ROLES if r.endswith("-meta")}
# Kinds a role reads as valid: meta.json lets unknown keys through; a folder's scan for tables passes over what is
# no regular file, as over a missing table (nothing is opened, nothing blocks).
VALID_FOR = {"long-key": META_ROLES, **{k: {"trace-configs-table"} for k in ("fifo", "device", "folder")}}


@dataclass(frozen=True)
class Case:
    role: str
    kind: Kind
    file: str  # the bad file's name, relative to the case's folder ("" for a flag's value)
    args: tuple[str, ...]


def _cases() -> list[Case]:
    cases = []
    for role, (name, args) in JSON_ROLES.items():
        kinds = JSON_KINDS + (CONFIG_KINDS if name == "config.json" else ())
        if name == "TINY_TABLE":  # the tiny shape's moebench table on this machine, which a trace of it reads
            from moebench.environment import device_name
            from moebench.tables.formats.moebench import file_name

            name = file_name(8, 64, device_name(), "fp16")
        for kind in kinds:
            if role in VALID_FOR.get(kind.name, ()):
                continue
            if role in META_ROLES:
                file = f"run/{name}"
            elif "{d}" in args:
                file = f"tables/{name}"
            else:
                file = f"in/{name}"
            cases.append(Case(role, kind, file, args))
    for role, (name, args) in TEXT_ROLES.items():
        cases += [Case(role, kind, f"in/{name}", args) for kind in TEXT_KINDS]
    for role, (name, args) in YAML_ROLES.items():
        cases += [Case(role, kind, f"in/{name}", args) for kind in YAML_KINDS]
    for role, args in ROWS_ROLES.items():
        for kind in ROW_KINDS + tuple(k for k in FILE_KINDS if k.name not in ("huge", "empty")):
            name = "rows.jsonl.gz" if kind.name == "gzip-bomb" else "rows.jsonl"
            cases.append(Case(role, kind, f"run/{name}", args))
    return cases


CASES = _cases()


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _refused(where: Path, args: tuple[str, ...], memory: bool = False) -> str:
    """``moebench ARGS`` in ``where``: exit 2, one short line, no traceback, nothing created or changed, within
    ``HANG_S`` (and ``PEAK_BYTES`` where ``memory``); the line."""
    before = _tree(where)

    def hung(*_):
        raise Hung(f"moebench {' '.join(args)[:200]} ran past {HANG_S} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_S)
    if memory:
        tracemalloc.start()
    try:
        proc = moebench_in_process(*args, cwd=where)
        peak = tracemalloc.get_traced_memory()[1] if memory else 0
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        if memory:
            tracemalloc.stop()
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert len(lines[0]) <= LINE_MAX, f"a {len(lines[0])}-character error line: {lines[0][:200]}..."
    assert _tree(where) == before, "the refusal created or removed something"
    assert peak <= PEAK_BYTES, f"{peak >> 20} MiB allocated"
    return lines[0]


def _run_folder(where: Path) -> Path:
    run = where / "run"
    run.mkdir()
    for f in ("meta.json", "rows.jsonl"):
        shutil.copy(QUICK / f, run / f)
    return run


@pytest.mark.parametrize("case", CASES, ids=[f"{c.role}-{c.kind.name}" for c in CASES])
def test_a_hostile_file_is_refused_in_one_line(tmp_path, case):
    """The bad file reaches the reader its command reads it with (the line names it), and is refused there."""
    run = _run_folder(tmp_path)
    target = tmp_path / case.file
    target.parent.mkdir(exist_ok=True)
    if target.exists() or target.is_symlink():
        target.unlink()
    if target.name == "rows.jsonl.gz":
        (run / "rows.jsonl").unlink()
    case.kind.write(target)
    args = tuple(a.replace("{f}", str(target)).replace("{d}", str(target.parent)).replace("RUN", str(run))
                 for a in case.args)
    line = _refused(tmp_path, args, case.kind.memory)
    assert target.name in line or target.parent.name in line, f"the refusal is not the file's: {line}"


# ---- bad values of flags, and names that would become path parts -----------------------------------------

VALUE_CASES = [  # (args, what the line says, why the case exists)
    (("sweep", "--model", "tiny", "--m", "1.5", "--path", "torch"), "not an integer", "--m 1.5 was cut to 1"),
    (("sweep", "--model", "tiny", "--m", str(10**30), "--path", "torch"), "token count", "M of 10**30 tokens"),
    (("sweep", "--experts", "8.5", "--hidden", "128", "--intermediate", "64", "--topk", "2"), "8.5",
     "a fractional --experts"),
    (("sweep", "--experts", str(10**9), "--hidden", "128", "--intermediate", "64", "--topk", "2", "--path",
      "torch"), "largest", "10**9 experts"),
    (("sweep", "--experts", "8", "--hidden", str(2**40), "--intermediate", "64", "--topk", "2", "--path", "torch"),
     "largest", "hidden 2**40"),
    (("tune", "--model", "tiny", "--m", "1.5"), "", "--m 1.5 in tune"),
    (("tune", "--experts", "8", "--hidden", str(2**40), "--intermediate", "64", "--topk", "2"), "largest",
     "hidden 2**40 in tune"),
    (("tune-tables", "--m", "1.5"), "", "--m 1.5 in tune-tables"),
    (("tune-tables", "--model", "x" * 5000), "", "an unknown 5,000-character model"),
    (("doctor", "--model", "tiny", "--dtype", "fp16", "--m", "1.5"), "", "--m 1.5 in doctor"),
    (("doctor", "--experts", str(10**9), "--hidden", "128", "--intermediate", "64", "--topk", "2", "--dtype",
      "fp16"), "largest", "10**9 experts in doctor"),
    (("doctor", "--model", "x" * 5000, "--dtype", "fp16"), "unknown model", "an unknown 5,000-character model"),
    (("retime", "--model", "tiny", "nowhere.json"), "no such", "a missing table"),
    (("warmup", "--experts", "8", "--hidden", str(2**40), "--intermediate", "64", "--topk", "2", "--dtype",
      "fp16"), "largest", "hidden 2**40 in warmup"),
    (("trace", "--experts", "8", "--hidden", str(2**40), "--intermediate", "64", "--topk", "2"), "largest",
     "hidden 2**40 in trace"),
    (("trace", "--model", "x" * 5000), "unknown model", "an unknown 5,000-character model"),
    (("step", "--model", "tiny", "--path", "torch", "--prompt", "1.5"), "", "--prompt 1.5 in step"),
    (("step", "--model", "tiny", "--path", "torch", "--context", str(10**30)), "", "a context of 10**30 tokens"),
    (("step", "--model", "x" * 5000), "", "an unknown 5,000-character model in step"),
    (("fit-check", "--runs", "nowhere"), "--runs nowhere", "a missing --runs folder was passed over"),
    (("fit-check", "--configs", "nowhere"), "nowhere", "a missing --configs folder"),
    (("fit-time", "nowhere.json"), "", "a missing points file"),
    (("isa", "--m", "1.5"), "", "--m 1.5 in isa"),
    (("isa", "--model", "x" * 5000), "", "an unknown 5,000-character model in isa"),
    (("profile", "--config", "[" * DEEP), "", "RecursionError in --config"),
    (("profile", "--config", '{"BLOCK_SIZE_M": Infinity}'), "", "Infinity in --config"),
    (("profile", "--m", "1.5"), "", "--m 1.5 in profile"),
    (("bounds", "nowhere"), "", "a missing run folder"),
    (("models", "extra"), "", "an argument models takes none of"),
    (("report", "nowhere"), "nowhere", "a missing run folder"),
    (("plot", "nowhere"), "nowhere", "a missing run folder in plot"),
    (("compare", "nowhere", "nowhere2"), "nowhere", "missing run folders"),
    (("export-configs", "nowhere"), "nowhere", "a missing run folder in export-configs"),
]


@pytest.mark.parametrize("args, says, why", VALUE_CASES, ids=[c[2] for c in VALUE_CASES])
def test_a_bad_value_is_refused_in_one_line(tmp_path, args, says, why):
    assert says in _refused(tmp_path, args)


def test_a_spec_without_m_takes_the_flags(tmp_path):
    """The README: flags override the spec; a spec that names no M runs at --m's."""
    (tmp_path / "s.yaml").write_text("name: t\nmodels: [tiny]\ndtypes: [fp16]\npaths: [torch]\n")
    proc = moebench_in_process("sweep", "s.yaml", "--m", "1", "--out", "out", "--no-progress", "--format", "csv",
                               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "tiny" in proc.stdout


def test_the_battery_covers_every_command():
    """Each command `moebench --help` lists is in some case."""
    from moebench.cli.main import cli

    named = {c.args[0] for c in CASES} | {a[0] for a, _, _ in VALUE_CASES}
    assert set(cli.commands) <= named, set(cli.commands) - named
    assert len(CASES) + len(VALUE_CASES) >= 300


# ---- the reader itself ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", JSON_KINDS, ids=[k.name for k in JSON_KINDS])
def test_read_json_refuses_in_one_line_naming_the_file(tmp_path, kind):
    f = tmp_path / "f.json"
    kind.write(f)
    if kind.name in ("long-key", "long-string", "array", "null"):
        bounded.read_json(f)  # JSON within the bounds: its readers refuse it for what it holds
        return
    with pytest.raises(bounded.Refused) as e:
        bounded.read_json(f)
    assert str(e.value).startswith(f"{f}: ") and "\n" not in str(e.value) and len(str(e.value)) < 200
