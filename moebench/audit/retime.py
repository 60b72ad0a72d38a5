"""``moebench retime``: a table's configs re-timed on this GPU, under the installed Triton and torch, against the
untuned default and the times they were tuned with; the drift gate to run before a Triton or torch upgrade lands.

TABLE | DIR -> ``tables.files`` (layout, configs, E, N, device, dtype; the hidden size and top-k from the shape
options, the moebench header or the export's sidecar) -> per table and M, the entry and the default of the
table's kernel form (vLLM, SGLang: triton-classic; SGLang's ``_down`` table of GEMM2: triton-classic-down, the
entry on GEMM2 and the default on GEMM1; moebench: triton) timed back to back (``audit.pairs``) ->
a verdict per M, SLOWER (or FAILED) marking a stale entry -> rows in a run folder; with ``write``, each stale
entry replaced by the faster of the two timed configs (the default), the other entries kept, the changed
tables and their sidecars written as one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from moebench.audit.pairs import REPEATS, Judged, against, open_run, row, time_pairs
from moebench.errors import UserError
from moebench.models import MoEShape
from moebench.tables.engine_entry import carried_note
from moebench.tables.files import TableFile, read_table, same_name, table_files, text_of
from moebench.tables.formats import FORMATS
from moebench.tables.table import ConfigTable

if TYPE_CHECKING:
    from moebench.workers.pools import Pools

STALE = ("SLOWER", "FAILED")  # verdicts of an entry that is worse than the default now
DOWN_NOTE = ("SGLang's table of GEMM2 (the down projection; GEMM1 runs the table without _down): each entry timed "
             "on GEMM2, GEMM1 at the default and both at GEMM1's BLOCK_SIZE_M as SGLang runs them, against the "
             "default on both")


@dataclass(frozen=True)
class Planned:
    """One table to re-time: the file, the shape and dtype it is timed at."""

    file: TableFile
    shape: MoEShape
    dtype: str


@dataclass(frozen=True)
class Line:
    """One M of a re-timed table: the entry against the default (``judged``), and against the time the sidecar
    says it was tuned with (``tuned_us``, ``vs_tuned`` = now / then, ``tuned_verdict``)."""

    judged: Judged
    tuned_us: float | None = None
    vs_tuned: float | None = None
    tuned_verdict: str = "UNKNOWN"

    @property
    def stale(self) -> bool:
        return self.judged.verdict in STALE


@dataclass
class Retimed:
    """A table re-timed: its lines by M, and whether its stale entries were replaced (``written``)."""

    planned: Planned
    lines: dict[int, Line]
    written: bool = False

    @property
    def stale(self) -> list[int]:
        return [M for M, line in self.lines.items() if line.stale]


@dataclass
class RetimeResult:
    run_dir: Path
    tables: list[Retimed]
    written: list[Path] = field(default_factory=list)


# ---- which tables, at which shape ------------------------------------------------------------------------

def _device(name: str) -> str:
    """A device name as the engines' file names fold it: underscores as spaces, the H200 family as one."""
    name = name.replace("_", " ")
    return "NVIDIA H200" if "H200" in name.split(" ") else name


def plan(targets: Sequence[Path], shape: MoEShape | None = None, hidden_topk: tuple[int, int] | None = None,
         dtype: str | None = None, *, interpreter: bool = False, device_name: str | None = None,
         notes: list[str] | None = None) -> list[Planned]:
    """The tables of ``targets`` (files, or folders of them) to re-time, each with its shape and dtype; creates
    nothing. ``shape``: the model's (sharded) shape, or ``hidden_topk`` (hidden size, top-k) with E and N from
    each file; neither: each file's header or sidecar. ``device_name``: this GPU (None on the interpreter). A
    file named alone that cannot be re-timed is a UserError (missing, unknown layout, another shape or dtype,
    no known hidden size); in a folder, tables of another shape, dtype or device are left out with a note, and
    each of a dtype moebench does not time (vLLM's int8_w8a16) with a note of its own."""
    notes = notes if notes is not None else []
    out: list[Planned] = []
    for target in targets:
        target = Path(target)
        folder = target.is_dir()
        skipped: list[str] = []
        untimed: list[str] = []  # of a dtype moebench does not time: a note each
        paths = table_files(target) if folder else [target]
        for path in paths:
            tf = read_table(path)
            if folder and tf.dtype is None:
                notes.append(f"{path.name}: left out: not a dtype moebench times ({tf.why})")
                untimed.append(f"{path.name}: not a dtype moebench times")
                continue
            try:
                out.append(_plan_one(tf, shape, hidden_topk, dtype, interpreter, device_name, folder))
            except _Skip as e:
                skipped.append(f"{path.name}: {e}")
                continue
            if tf.down:
                notes.append(f"{path.name}: {DOWN_NOTE}")
            carried = carried_note(tf.table.extras, tf.layout, FORMATS[tf.layout].READER)
            if carried:
                notes.append(f"{path.name}: {carried}")
        if skipped:
            notes.append(f"{target}: {len(skipped)} table(s) left out; the first: {skipped[0]}")
        if folder and len(skipped) + len(untimed) == len(paths):
            raise UserError(f"{target}: no table to re-time here ({(skipped or untimed)[0]})")
    if interpreter and any(p.dtype != p.file.dtype for p in out):
        notes.append("No CUDA GPU: bf16 tables are timed in fp16 on the interpreter (--dtype chooses).")
    return out


class _Skip(Exception):
    """A table of a folder that is not re-timed here (another shape, dtype or device)."""


def _plan_one(tf: TableFile, shape: MoEShape | None, hidden_topk: tuple[int, int] | None, dtype: str | None,
              interpreter: bool, device_name: str | None, in_folder: bool) -> Planned:
    def refuse(why: str):
        if in_folder:
            raise _Skip(why)
        raise UserError(f"{tf.path}: {why}")

    if tf.dtype is None:
        refuse(f"not a dtype moebench times ({tf.why})")
    if dtype is not None and not same_name(tf, dtype):
        refuse(f"a {tf.dtype} table, not {dtype}")
    run_dtype = dtype or ("fp16" if interpreter and tf.dtype == "bf16" else tf.dtype)
    if device_name is not None and _device(tf.device_name) != _device(device_name) and in_folder:
        refuse(f"a table for {tf.device_name}, and this GPU is {device_name}")
    if shape is not None:
        if tf.layout == "sglang" and shape.shared_experts == 1 and not shape.mapped \
                and (shape.experts + 1, shape.intermediate) == (tf.experts, tf.n):
            from moebench.models import fuse_shared

            shape = fuse_shared(shape)  # SGLang's file of the layer with its shared expert fused in (E+1)
        if (shape.experts, shape.intermediate) != (tf.experts, tf.n):
            refuse(f"shape mismatch: the file is E={tf.experts},N={tf.n}; {shape.name} is "
                   f"E={shape.experts},N={shape.intermediate} (--tp/--ep shard it)")
        return Planned(tf, shape, run_dtype)
    hidden, topk = hidden_topk or (tf.hidden, tf.topk)
    if hidden is None or topk is None:
        refuse("its hidden size is not in the file name and no export sidecar lists it: give --model, "
               "--hf-config, or --hidden and --topk")
    from moebench.models import explicit_shape

    return Planned(tf, explicit_shape(tf.experts, hidden, tf.n, topk, name=tf.model), run_dtype)


def check(planned: Sequence[Planned], write: bool) -> None:
    """Before anything runs: each table's kernel runs its shape here, and (``write``) each sidecar to update
    is one this moebench can update; UserError (one line) for the first that fails."""
    from moebench.paths.base import Target
    from moebench.paths.registry import get_path
    from moebench.problem import Problem, check_fits
    from moebench.tables.export import read_sidecar

    target = Target.current()
    for p in planned:
        problems = [Problem(p.shape, M, p.dtype) for M in p.file.table]
        check_fits(problems, target.device)
        reason = get_path(p.file.kernel).supports(problems[0], target)
        if reason:
            raise UserError(f"{p.file.path}: {p.file.kernel} cannot run {p.shape.name} {p.dtype} here: {reason}")
        if write and p.file.sidecar is not None:
            read_sidecar(p.file.sidecar)


# ---- timing, rows, the refreshed files -------------------------------------------------------------------

def retime(planned: Sequence[Planned], out_base: Path, pools: Pools, *, repeats: int = REPEATS,
           write: bool = False, on_progress=None) -> RetimeResult:
    """Re-time every table of ``planned`` on ``pools`` into a new run folder under ``out_base`` (see the module
    docstring); with ``write``, replace the stale entries (``check`` first)."""
    from moebench.paths.base import Target
    from moebench.paths.registry import get_path
    from moebench.problem import Problem

    target = Target.current()
    writer = open_run(out_base, "retime", target.interpreter, retime={
        "tables": [str(p.file.path) for p in planned], "repeats": repeats, "write": write})
    result = RetimeResult(writer.run_dir, [])
    with writer:
        for p in planned:
            path = get_path(p.file.kernel)
            problems = {M: Problem(p.shape, M, p.dtype) for M in p.file.table}
            pairs = {M: (cfg, path.default_config(problems[M])) for M, cfg in p.file.table.items()}
            source = {(M, pair[1].key()): "heuristic" for M, pair in pairs.items()}
            source.update({(M, pair[0].key()): f"table:{p.file.path.name}@M={M}" for M, pair in pairs.items()})

            def record(t, problems=problems, source=source, kernel=p.file.kernel) -> None:
                writer.append(row(problems[t.M], kernel, target, t, source.get((t.M, t.config.key()))))

            judged = time_pairs(pools.bench(p.file.kernel, problems, record, on_progress), pairs, "default", repeats)
            result.tables.append(Retimed(p, {M: _line(p, j, target) for M, j in judged.items()}))
        if write:
            result.written = _write_stale(result, writer.meta)
    return result


def _line(p: Planned, j: Judged, target) -> Line:
    """The line of one M, with the time the entry was tuned with where the sidecar's is comparable: the same
    shape, dtype and device, and a GPU here."""
    on = p.file.tuned_on
    comparable = (not target.interpreter and on.get("hidden") == p.shape.hidden and on.get("topk") == p.shape.topk
                  and on.get("dtype") == p.dtype and _device(str(on.get("device_name"))) == _device(_here()))
    then = p.file.tuned.get(j.M) if comparable else None
    ratio, verdict = against(j.a_us, j.a_spread, then)
    return Line(j, then.get("time_us") if then else None, ratio, verdict)


def _here() -> str:
    from moebench.environment import device_name

    return device_name()


def _write_stale(result: RetimeResult, meta: dict) -> list[Path]:
    """Each table with stale entries, those replaced by the default where it ran (faster, by the verdict), the
    rest kept; each sidecar listing one records what was replaced. Written as one; the files written."""
    import json

    from moebench.store.atomic import write_files_atomic
    from moebench.tables.export import read_sidecar

    files: dict[Path, str] = {}
    sidecars: dict[Path, dict] = {}
    for t in result.tables:
        replaced = {M: t.lines[M].judged for M in t.stale if t.lines[M].judged.b_us is not None}
        if not replaced:
            continue
        tf = t.planned.file
        entries = dict(tf.table)
        entries.update({M: j.b for M, j in replaced.items()})
        extras = {M: more for M, more in tf.table.extras.items() if M not in replaced}  # kept with their entries
        files[tf.path] = text_of(tf, ConfigTable(entries, order=tf.table.order, extras=extras))
        t.written = True
        if tf.sidecar is not None:
            car = sidecars.setdefault(tf.sidecar, read_sidecar(tf.sidecar))
            entry = car["files"].get(tf.sidecar_key)
            if isinstance(entry, dict):
                times = entry.setdefault("times", {})
                for M, j in replaced.items():
                    times[str(M)] = {"time_us": j.b_us, "p20_us": None, "p80_us": None}
                entry.setdefault("refreshed", []).append({
                    "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "M": sorted(replaced),
                    "by": "the default", "triton_version": meta.get("triton"), "torch_version": meta.get("torch"),
                    "run": str(result.run_dir)})
    files.update({path: json.dumps(car, indent=2) + "\n" for path, car in sidecars.items()})
    if files:
        write_files_atomic(files)
    return [p for p in files if p not in sidecars]
