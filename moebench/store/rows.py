"""One result row: the schema of a run's ``rows.jsonl``, declared once; and the types of meta.json's keys.

A ``Row`` is one benchmark point run on one path with one tile config: what was
run (the problem, the path, the config), what happened (status, the check
against the float32 reference, the error), and what was measured (time,
roofline figures). Its fields, in order, are the columns every row carries
(``runfolder.ROW_COLUMNS``); ``as_dict`` is the record written to disk, and ``check_row`` the test a record read back
from disk passes (the fields without a default present, every field of its declared type).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import TYPE_CHECKING

from moebench.errors import short
from moebench.filenames import why_not_part

if TYPE_CHECKING:
    from moebench.paths.base import Target
    from moebench.problem import Problem

STATUSES = ("ok", "unsupported", "incorrect", "error")
# Why a tuning candidate has no time (``status`` "error" or "incorrect"): its kernels failed to compile, needed
# more shared memory or registers than the GPU has, gave a wrong result, ran past the time limit, killed its
# worker process, or raised another GPU-side error.
FAILURES = ("compile", "resources", "incorrect", "hang", "crash", "error")
# A trace run's row (``moebench trace``): one request of the replayed stream, its latency and the variants built.
TRACE_REQUEST_COLUMNS = ("i", "M", "config", "config_source", "latency_ms", "warm_ms", "excess_ms", "compiles",
                         "compile_kernels")
# What a tuning row is: a short timing that ranks candidates, the longer re-timing of the few kept, or a
# chosen config re-timed back to back with the path's untuned one ("default") or with another run's choice
# ("check", ``moebench tune --check-against``).
PHASES = ("screen", "final", "default", "check")


@dataclass(frozen=True)
class Row:
    # the point: model shape, tokens, dtype, path, routing
    model: str
    experts: int
    hidden: int
    intermediate: int
    topk: int
    moe_layers: int
    M: int
    dtype: str
    path: str
    routing: str
    seed: int
    config: dict | None = None  # TileConfig.as_dict() for a tunable path, else None
    # what happened
    status: str = "ok"  # one of STATUSES
    correct: bool | None = None  # output within the dtype's tolerance of the float32 reference
    rel_err: float | None = None  # ||out - ref|| / ||ref||
    # what was measured
    time_us: float | None = None  # median
    time_p20_us: float | None = None
    time_p80_us: float | None = None
    reps: int | None = None
    floor_us: float | None = None  # the roofline's time floor for the bytes and FLOPs of the point
    bound: str | None = None  # which ceiling sets the floor
    pct_of_floor: float | None = None  # 100 * floor_us / time_us
    tflops: float | None = None
    gbps: float | None = None
    flops: int | None = None  # 2 * M * topk * 3 * I * hidden; with global_experts, of the local slots drawn
    bytes: int | None = None  # Problem.min_bytes of the experts touched
    experts_touched: int | None = None
    # where and how
    device_name: str = ""
    interpreter: bool = False  # timed on the CPU interpreter: correctness only
    timing_method: str | None = None
    error: str | None = None  # why the point has no time (one line)
    # tuning (``moebench tune``); None in a sweep's rows
    phase: str | None = None  # one of PHASES
    failure: str | None = None  # one of FAILURES, where a candidate has no time
    # where a tunable path's config came from: a table ('configs:'/'env:'/'shipped:' + file @M=key, see
    # moebench.tables.lookup), 'heuristic' (the path's untuned default), 'pinned', or 'tuned' (sweep --tune;
    # 'candidate' in older runs)
    config_source: str | None = None
    # expert parallelism through an expert_map (sweep --ep-map): the experts the top-k ids range over, of which
    # the point's rank holds ``experts`` (global ids 0..experts-1); None: the ids are local (no map)
    global_experts: int | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"row status {self.status!r}; known: {', '.join(STATUSES)}")
        if self.phase is not None and self.phase not in PHASES:
            raise ValueError(f"row phase {self.phase!r}; known: {', '.join(PHASES)}")
        if self.failure is not None and self.failure not in FAILURES:
            raise ValueError(f"row failure {self.failure!r}; known: {', '.join(FAILURES)}")

    @classmethod
    def for_point(cls, problem: Problem, path_name: str, target: Target) -> Row:
        """The row of ``problem`` on path ``path_name`` on ``target``, before anything is run."""
        from moebench.environment import device_name

        s = problem.shape
        return cls(
            model=s.name, experts=s.experts, hidden=s.hidden, intermediate=s.intermediate, topk=s.topk,
            moe_layers=s.moe_layers, M=problem.M, dtype=problem.dtype, path=path_name, routing=problem.routing,
            seed=problem.seed, flops=None if s.mapped else problem.flops, device_name=device_name(),
            interpreter=target.interpreter, global_experts=s.routed_experts if s.mapped else None,
        )

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """The column names, in order."""
        return tuple(f.name for f in fields(cls))

    def as_dict(self) -> dict:
        """The record as written to ``rows.jsonl``: every column, in order."""
        return asdict(self)


# ---- a record read back -------------------------------------------------------------------------------

# The JSON types each annotation names: a float column takes an integer too (JSON writes 2.0 as 2.0, but other
# writers may not); bool is never an int here, though Python counts it as one.
_JSON_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "dict": (dict,)}
# Fields that become parts of file names (an export's table is named by device_name, a tune's folder by model)
NAME_FIELDS = ("model", "dtype", "path", "device_name")
_CHOICES = {"status": STATUSES, "phase": PHASES, "failure": FAILURES}


def _field_types() -> dict[str, tuple[tuple[type, ...], bool, bool]]:
    """Per field of Row: (accepted JSON types, None accepted, required: no default)."""
    out = {}
    for f in fields(Row):
        names = [n.strip() for n in str(f.type).split("|")]
        types = tuple(t for n in names if n != "None" for t in _JSON_TYPES[n])
        required = f.default is MISSING and f.default_factory is MISSING
        out[f.name] = (types, "None" in names, required)
    return out


_FIELD_TYPES = _field_types()


def _type_name(value: object) -> str:
    return "null" if value is None else {dict: "object", list: "array", str: "string"}.get(type(value),
                                                                                         type(value).__name__)


def check_row(record: dict) -> str | None:
    """What makes ``record`` (one line of a rows.jsonl) no ``Row``, naming the field; None where it is one.

    A field with a default may be absent (rows written before it existed); columns Row does not declare are
    let through (a ``bounds`` run adds its own).
    """
    for name, (types, nullable, required) in _FIELD_TYPES.items():
        if name not in record:
            if required:
                return f"field {name!r} is missing (not a moebench benchmark row)"
            continue
        value = record[name]
        if value is None:
            if nullable:
                continue
            return f"field {name!r} is null"
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            expected = " or ".join(dict.fromkeys(_type_name(t()) for t in types))
            return f"field {name!r} is {_type_name(value)} {short(value, 40)}, expected {expected}"
        if name in _CHOICES and value not in _CHOICES[name]:
            return f"field {name!r} is {short(value, 40)}, expected one of {', '.join(_CHOICES[name])}"
        if name in NAME_FIELDS and value and (why := why_not_part(value)):
            return f"field {name!r} {short(value, 40)} {why}"
    return None


# ---- a run's meta.json read back ----------------------------------------------------------------------

# The keys of meta.json that readers use, with the JSON types each may hold (None: may be null); other keys are
# let through. ``ceilings`` maps names to numbers (or null: not measured).
_META_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "schema_version": ((int,), True), "status": ((str,), True), "kind": ((str,), True),
    "interpreter": ((bool,), True), "tune": ((bool,), True), "ceilings": ((dict,), True),
    "pid": ((int,), True), "requests": ((int,), True), "startup_runs": ((int,), True),
    "resumed": ((list,), False), "summary": ((dict,), True), "tuning": ((dict,), True), "ep_map": ((dict,), True),
    "wall_s": ((int, float), True), "wall_s_by_start": ((list,), False),
    **{k: ((str,), True) for k in ("git_commit", "timing_method", "count_method", "sweep", "started", "finished",
                                   "device_name", "gpu_name", "triton", "torch", "host", "distribution", "error",
                                   "stopped_by")},
}


def check_meta(meta: dict) -> str | None:
    """What makes ``meta`` (a run's meta.json) unreadable to the reports, naming the key; None where nothing."""
    for key, (types, nullable) in _META_TYPES.items():
        value = meta.get(key)
        if key not in meta or (value is None and nullable):
            continue
        if value is None or not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            expected = " or ".join(dict.fromkeys(_type_name(t()) for t in types))
            return f"key {key!r} is {_type_name(value)} {short(value, 40)}, expected {expected}"
    for name, value in (meta.get("ceilings") or {}).items():
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            return f"ceilings[{name!r}] is {_type_name(value)} {short(value, 40)}, expected a number"
    return None
