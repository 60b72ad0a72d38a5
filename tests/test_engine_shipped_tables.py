"""Every H200 table vLLM 0.33.0 and SGLang 0.5.23 ship, read through moebench's own readers.

The fixture (tests/data/engine-tables/h200-shipped.json.gz) holds each shipped file's name, its JSON object and its
text form (indent 2 or 4, a closing newline or none: ``form``, read from the wheels' files); a test lays the file
out as the engine does (vLLM's flat in one folder, SGLang's under ``configs/triton_<x_y_z>/``) in that form. Per
file: ``read_table`` reads it with the layout, E, N, device, dtype and GEMM (both, or GEMM2 alone for SGLang's
``_down``) its name says; each entry comes back as the engine reads it (the file's order, the six keys with
Triton's launch defaults where an entry leaves num_warps or num_stages out, other keys kept in ``extras``);
``text_of`` writes the file back unchanged, in any indent and with or without the closing newline, and with an
entry replaced changes that entry alone; retime's planner takes it at a shape of its E and N (a ``_down`` table
on the path that runs its entry on GEMM2), and takes every table of each engine's folder, leaving out vLLM's
int8_w8a16 files (a dtype moebench does not time) with a note each.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import NamedTuple

import pytest

from moebench.audit import retime as retime_module
from moebench.errors import UserError
from moebench.models import explicit_shape
from moebench.tables.files import read_table, same_name, text_of
from moebench.tables.table import ConfigTable
from moebench.tile import TileConfig

FIXTURE = Path(__file__).parent / "data" / "engine-tables" / "h200-shipped.json.gz"
SHIPPED = json.loads(gzip.decompress(FIXTURE.read_bytes()))

# The H200 files ("NVIDIA_H200" in the name) of vllm/model_executor/layers/fused_moe/configs/ in the vllm 0.33.0
# wheel, and of sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_*/ in the sglang 0.5.23 wheel (both
# from PyPI; the fixture's "source" names the wheels).
VLLM_H200_FILES = 52
SGLANG_H200_FILES = 80

SIX = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
LAUNCH_DEFAULTS = {"num_warps": 4, "num_stages": 3}  # Triton's, where an entry leaves them out
HIDDEN = 4096  # any hidden size: the file names say E and N only

_NAME = re.compile(r"E=(?P<E>\d+),N=(?P<N>\d+),device_name=(?P<device>\w+?)(?:,dtype=(?P<dtype>\w+?))?"
                   r"(?:,block_shape=\[(?P<block>\d+, ?\d+)\])?(?P<channel>,per_channel_quant=True)?(?P<down>_down)?"
                   r"\.json")

# ---- the files that exercise a rule --------------------------------------------------------------------------

DOWN_FILES = {key for key in SHIPPED["sglang"] if key.endswith("_down.json")}  # SGLang's GEMM2 tables
INT8_FILES = {key for key in SHIPPED["vllm"] if ",dtype=int8_w8a16" in key}  # a dtype moebench does not time
# vLLM files whose "triton_version" entry comes first: a write-back keeps it there
VERSION_FIRST_FILES = {
    "E=128,N=1856,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
    "E=128,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
    "E=128,N=512,device_name=NVIDIA_H200.json",
    "E=128,N=96,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
    "E=128,N=96,device_name=NVIDIA_H200.json",
    "E=16,N=4096,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
    "E=160,N=192,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
    "E=256,N=320,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
    "E=256,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
    "E=32,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
}
# an SGLang entry (M=256) leaving num_warps and num_stages out: a write-back adds no defaults
NO_WARPS_FILES = {"triton_3_7_1/E=256,N=512,device_name=NVIDIA_H200.json"}
# Files written again in another text form than the one they ship in (each case: why)
REFORMATTED = [
    ("vllm", "E=128,N=512,device_name=NVIDIA_H200.json", 2, False),  # triton_version first; indent 2, no newline
    ("vllm", "E=1,N=3072,device_name=NVIDIA_H200,dtype=int8_w8a16.json", 4, True),  # not timed; ships unended
    ("sglang", "triton_3_7_1/E=256,N=512,device_name=NVIDIA_H200.json", 2, True),  # an entry without num_warps
    ("sglang", "triton_3_6_0/E=256,N=512,device_name=NVIDIA_H200_down.json", 2, False),  # _down, USE_TMA carried
    ("sglang", "triton_3_6_0/E=256,N=512,device_name=NVIDIA_H200_down.json", None, False),  # on one line
]


class Shipped(NamedTuple):
    engine: str  # "vllm" or "sglang"
    key: str  # the file name; SGLang's with its triton_<x_y_z>/ folder
    content: dict

    @property
    def form(self) -> tuple[int, bool]:
        """The shipped file's indent and whether it ends in a newline."""
        indent, newline = SHIPPED["form"][self.engine][self.key]
        return indent, newline

    def lay_out(self, root: Path, form: tuple[int | None, bool] | None = None) -> Path:
        """The file under ``root`` as the engine keeps it, in its shipped text form (or ``form``)."""
        indent, newline = form or self.form
        path = root / self.engine / self.key if self.engine == "vllm" else root / "sglang" / "configs" / self.key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.content, indent=indent) + ("\n" if newline else ""))
        return path


def shipped(engine: str, key: str) -> Shipped:
    return Shipped(engine, key, SHIPPED[engine][key])


def cases(leave_out: set[str] = frozenset()) -> list:
    """Every shipped file but those of ``leave_out`` as a parameter (id: its key)."""
    return [pytest.param(shipped(engine, key), id=key) for engine in ("vllm", "sglang") for key in SHIPPED[engine]
            if key not in leave_out]


def named(key: str) -> dict:
    """What the file name says: E, N, device and moebench's dtype (None: a dtype moebench does not time)."""
    m = _NAME.fullmatch(key.rsplit("/", 1)[-1])
    assert m, key
    block = m["block"] and tuple(int(b) for b in m["block"].split(","))
    if m["dtype"] is None:
        dtype = "bf16"
    elif m["dtype"] != "fp8_w8a8":
        dtype = None
    else:
        dtype = "fp8-block128" if block == (128, 128) else "fp8-channel" if m["channel"] else "fp8-tensor"
    return {"E": int(m["E"]), "N": int(m["N"]), "device": m["device"].replace("_", " "), "dtype": dtype}


def test_the_fixture_holds_every_h200_table_the_engines_ship():
    assert len(SHIPPED["vllm"]) == VLLM_H200_FILES and len(SHIPPED["sglang"]) == SGLANG_H200_FILES
    assert all("NVIDIA_H200" in key for engine in ("vllm", "sglang") for key in SHIPPED[engine])
    assert all(re.fullmatch(r"triton_\d+_\d+_\d+/[^/]+\.json", key) for key in SHIPPED["sglang"])
    assert set(SHIPPED["source"]) == {"vllm", "sglang"}
    forms = [tuple(f) for engine in ("vllm", "sglang") for f in SHIPPED["form"][engine].values()]
    assert all(set(SHIPPED["form"][e]) == set(SHIPPED[e]) for e in ("vllm", "sglang"))
    assert {f[0] for f in forms} == {2, 4} and {f[1] for f in forms} == {True, False}  # both kinds of each ship
    assert len(DOWN_FILES) == 11 and len(INT8_FILES) == 2  # the preconditions of the cases named for them
    assert all(list(SHIPPED["vllm"][k])[0] == "triton_version" for k in VERSION_FIRST_FILES)
    (nw,) = NO_WARPS_FILES
    assert "num_warps" not in SHIPPED["sglang"][nw]["256"]


@pytest.mark.parametrize("shipped", cases())
def test_read_table_reads_the_layout_shape_and_dtype_its_name_says(shipped, tmp_path):
    tf = read_table(shipped.lay_out(tmp_path))
    says = named(shipped.key)
    assert (tf.layout, tf.experts, tf.n, tf.device_name, tf.dtype) == (
        shipped.engine, says["E"], says["N"], says["device"], says["dtype"])
    assert tf.dtype is None or same_name(tf, tf.dtype)  # moebench names a file of that dtype as this one is named
    assert tf.triton_version == (shipped.content.get("triton_version") if shipped.engine == "vllm" else None)
    assert tf.down == (shipped.key in DOWN_FILES)
    assert tf.kernel == ("triton-classic-down" if tf.down else "triton-classic")


@pytest.mark.parametrize("shipped", cases())
def test_every_entry_reads_as_the_engine_reads_it(shipped, tmp_path):
    tf = read_table(shipped.lay_out(tmp_path))
    raw = {int(m): entry for m, entry in shipped.content.items() if m != "triton_version"}  # vLLM drops it
    assert list(tf.table.order) == list(raw)  # the file's order, which the nearest-M rule breaks ties by
    for m, entry in raw.items():
        assert tf.table[m].to_vllm_dict() == {k: entry.get(k, LAUNCH_DEFAULTS.get(k)) for k in SIX}
        assert tf.table.extras.get(m, {}) == {k: v for k, v in entry.items() if k not in SIX}


@pytest.mark.parametrize("shipped", cases())
def test_text_of_writes_the_file_back_unchanged(shipped, tmp_path):
    path = shipped.lay_out(tmp_path)
    tf = read_table(path)
    assert text_of(tf, tf.table) == path.read_text()  # retime --write keeps what it does not replace


@pytest.mark.parametrize("engine, key, indent, newline", REFORMATTED)
def test_text_of_keeps_any_indent_and_closing_newline(engine, key, indent, newline, tmp_path):
    file = shipped(engine, key)
    assert (indent, newline) != tuple(file.form)  # the precondition: not the form it ships in
    path = file.lay_out(tmp_path, (indent, newline))
    tf = read_table(path)
    assert text_of(tf, tf.table) == path.read_text()


@pytest.mark.parametrize("engine, key", [
    ("vllm", "E=128,N=512,device_name=NVIDIA_H200.json"),  # triton_version first
    ("vllm", "E=16,N=1024,device_name=NVIDIA_H200.json"),  # indent 2, no closing newline
    ("sglang", "triton_3_7_1/E=256,N=512,device_name=NVIDIA_H200.json"),  # M=256 without num_warps, num_stages
    ("sglang", "triton_3_6_0/E=256,N=512,device_name=NVIDIA_H200_down.json"),  # USE_TMA on every entry
])
def test_text_of_with_an_entry_replaced_changes_that_entry_alone(engine, key, tmp_path):
    file = shipped(engine, key)
    tf = read_table(file.lay_out(tmp_path))
    first = tf.table.order[0]
    new = TileConfig(64, 64, 32, 8, 4, 3)  # the engines' default (M > E)
    entries = {**tf.table, first: new}
    extras = {m: more for m, more in tf.table.extras.items() if m != first}  # retime drops the replaced entry's
    text = text_of(tf, ConfigTable(entries, order=tf.table.order, extras=extras))
    want = dict(file.content)
    want[str(first)] = new.to_vllm_dict()
    indent, newline = file.form
    assert text == json.dumps(want, indent=indent) + ("\n" if newline else "")
    assert list(json.loads(text)) == list(file.content)  # the file's keys in its order, triton_version included


@pytest.mark.parametrize("shipped", cases(leave_out=INT8_FILES))
def test_retime_plans_it_at_a_shape_of_its_e_and_n(shipped, tmp_path):
    path = shipped.lay_out(tmp_path)
    says = named(shipped.key)
    shape = explicit_shape(says["E"], HIDDEN, says["N"], min(8, says["E"]))
    notes: list[str] = []
    (planned,) = retime_module.plan([path], shape, notes=notes)
    assert planned.file.path == path and planned.dtype == says["dtype"]
    assert (planned.shape.experts, planned.shape.intermediate) == (says["E"], says["N"])
    assert (retime_module.DOWN_NOTE in " ".join(notes)) == (shipped.key in DOWN_FILES)  # what is timed, said


@pytest.mark.parametrize("key", sorted(INT8_FILES))
def test_an_int8_table_alone_is_one_line_refused_and_in_a_folder_left_out_with_a_note(key, tmp_path):
    path = shipped("vllm", key).lay_out(tmp_path)
    says = named(key)
    shape = explicit_shape(says["E"], HIDDEN, says["N"], min(8, says["E"]))
    with pytest.raises(UserError, match="not a dtype moebench times") as e:
        retime_module.plan([path], shape)
    assert "\n" not in str(e.value) and path.name in str(e.value)
    other = shipped("vllm", "E=128,N=512,device_name=NVIDIA_H200.json").lay_out(tmp_path)
    notes: list[str] = []
    (planned,) = retime_module.plan([path.parent], hidden_topk=(HIDDEN, 8), notes=notes)
    assert planned.file.path == other
    assert [n for n in notes if n.startswith(path.name)] == [
        f"{path.name}: left out: not a dtype moebench times (dtype=int8_w8a16: moebench tunes bf16, fp16, fp32 "
        "and fp8_w8a8)"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_retime_plans_every_table_of_an_engines_folder(engine, tmp_path):
    """The engine's whole folder at one hidden size and top-k: every table planned at its own E and N, the
    int8_w8a16 ones left out with a note each, each _down one on the path that runs its entries on GEMM2."""
    for key in SHIPPED[engine]:
        shipped(engine, key).lay_out(tmp_path)
    folder = tmp_path / engine
    notes: list[str] = []
    planned = retime_module.plan([folder], hidden_topk=(HIDDEN, 8), notes=notes)
    keys = {p.file.path.relative_to(folder / "configs" if engine == "sglang" else folder).as_posix()
            for p in planned}
    assert keys == set(SHIPPED[engine]) - INT8_FILES
    assert sum("left out: not a dtype moebench times" in n for n in notes) == (len(INT8_FILES) if engine == "vllm"
                                                                                else 0)
    assert {p.file.kernel for p in planned if p.file.down} <= {"triton-classic-down"}
    assert sum(p.file.down for p in planned) == (len(DOWN_FILES) if engine == "sglang" else 0)
