"""A step run: a request validated before anything is written, then each point's parts checked and timed, the
stack timed whole, rows appended to a run folder as they finish.

    StepRequest -> validate (paths, --vs, memory: UserError, nothing written) -> Model built once
        -> per point: shared parts, the MoE layer per path, the all-reduce row, the stack -> rows.jsonl

A stopped run of the same request (``step_request``) resumes in its folder, as a sweep does: the rows it holds
(``step_identity``) are kept and not run again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from moebench.dtypes import get_dtype
from moebench.environment import describe
from moebench.errors import UserError
from moebench.measure.roofline import measure_ceilings
from moebench.measure.timer import run_method
from moebench.paths.base import Target
from moebench.paths.registry import get_path
from moebench.problem import Problem, memory_bytes
from moebench.report import compose
from moebench.step.config import StepConfig, StepPoint
from moebench.step.counts import DEFAULT_ALLREDUCE_GBPS, allreduce_row, part_counts
from moebench.step.measure import measure_part, time_closure
from moebench.step.parts import Tiles
from moebench.step.stack import Model
from moebench.store.resume import find_resumable, request_key, stopped_in
from moebench.store.runfolder import RunWriter, ensure_out_dir, new_run_dir
from moebench.store.step_rows import STEP_COLUMNS, blank_row


@dataclass(frozen=True)
class StepRequest:
    config: StepConfig
    dtype: str
    paths: tuple[str, ...]
    points: tuple[StepPoint, ...]
    vs: str | None = None  # the path the others are compared against
    allreduce_gbps: float = DEFAULT_ALLREDUCE_GBPS
    allreduce_latency_us: float = 0.0
    stack_layers: int = 4  # 0: no composition check
    seed: int = 0
    configs_dir: str | None = None
    tile_fields: tuple[tuple[str, Any], ...] = ()  # set on each of moebench's configs (--tile NAME=VALUE)

    @property
    def tiles(self) -> Tiles:
        return Tiles(self.configs_dir, self.tile_fields)

    def problem(self, point: StepPoint) -> Problem:
        return Problem(self.config.moe, point.tokens, self.dtype, seed=self.seed)


def reasons(request: StepRequest, target: Target) -> dict[tuple[str, StepPoint], str | None]:
    """Per (path, point): why the path cannot run the point's MoE layer here, or None."""
    return {(name, p): get_path(name).supports(request.problem(p), target) for name in request.paths
            for p in request.points}


def bytes_needed(request: StepRequest, point: StepPoint) -> int:
    """The bytes a point holds at once, at least: the stack's layers (MoE weights as ``Problem.bytes_needed``
    counts them, attention, router and shared weights, KV caches), the dense MLP and the head, the activations and
    the float32 references of one layer."""
    cfg, act = request.config, get_dtype(request.dtype).act_bytes
    H, M, n = cfg.hidden, point.tokens, max(1, request.stack_layers)
    if cfg.attention == "gqa":
        attn = H * (2 * cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim
    else:
        attn = (cfg.q_lora_rank * H + cfg.heads * cfg.qk_head_dim * (cfg.q_lora_rank or H)
                + cfg.kv_cache_width * H + 2 * cfg.heads * (cfg.qk_nope_head_dim + cfg.v_head_dim) * cfg.kv_lora_rank
                + H * cfg.heads * cfg.v_head_dim)
    per_layer = (attn + cfg.moe.routed_experts * H + 3 * cfg.shared_intermediate * H) * act
    cache = point.batch * point.length * cfg.kv_cache_width if point.phase == "decode" else 0  # elements
    moe = request.problem(point).bytes_needed(reference=True)
    dense_head = (3 * cfg.dense_intermediate * H + cfg.vocab * H) * act + point.head_rows * cfg.vocab * 8
    widest = max(4 * H, cfg.heads * cfg.qk_head_dim * 3, 2 * max(cfg.dense_intermediate, cfg.shared_intermediate))
    activations = 4 * M * widest * 4  # a few [M, widest] float32 temporaries of a reference
    return n * (per_layer + moe + cache * act) + cache * 4 + dense_head + activations


def validate(request: StepRequest, target: Target) -> dict[tuple[str, StepPoint], str | None]:
    """The per-(path, point) reasons; UserError where a path runs none of the points here, ``vs`` is not one of
    the paths, or a point cannot fit in the device's memory (with the bytes it needs)."""
    if not request.points:
        raise UserError("nothing to run: give --prompt lengths or --batch sizes")
    if request.vs is not None and request.vs not in request.paths:
        raise UserError(f"--vs {request.vs}: not one of the paths run ({', '.join(request.paths)})")
    why = reasons(request, target)
    for name in request.paths:
        found = [why[(name, p)] for p in request.points]
        if all(found):
            where = "on this machine (no CUDA GPU)" if target.device.type == "cpu" else "here"
            raise UserError(f"path '{name}' cannot run any point of {request.config.name} {request.dtype} {where}: "
                            f"{found[0]}")
    capacity = memory_bytes(target.device)
    for p in request.points:
        need = bytes_needed(request, p)
        if need > capacity:
            where = "this machine's memory" if target.device.type == "cpu" else "the GPU's memory"
            raise UserError(f"{request.config.name} {request.dtype} {p.phase} batch={p.batch} length={p.length} "
                            f"needs {need / 2**30:,.1f} GiB ({max(1, request.stack_layers)} layers' weights, KV "
                            f"cache, activations, float32 references), more than the {capacity / 2**30:,.1f} GiB of "
                            f"{where}; try a smaller --batch, --context or --stack")
    return why


def stack_path(request: StepRequest) -> str:
    """The path the stack runs: the first graph-safe one that is not the reference, else the first."""
    safe = [n for n in request.paths if get_path(n).graph_safe and not get_path(n).baseline]
    return (safe or list(request.paths))[0]


def step_request(request: StepRequest, device: str, interpreter: bool) -> dict:
    """What a step run is asked to do, as plain data for ``request_key``: the request and the device; not where
    its folder goes, nor how progress shows."""
    return {"kind": "step", **asdict(request), "device": device, "interpreter": interpreter}


def step_identity(row: dict) -> tuple:
    """What a step row is a measurement of, within its run: the point, the part and the path."""
    return row["phase"], row["batch"], row["length"], row["part"], row["path"]


def run_step(request: StepRequest, out_base: Path, on_row: Callable[[dict], None] | None = None,
             target: Target | None = None, resume: bool = True,
             on_resume: Callable[[Path, dict], None] | None = None) -> tuple[Path, list[dict]]:
    """Run every point of ``request`` (validated first); return the run folder and its rows (a resumed folder's
    kept rows first). With ``resume``, a stopped run of the same request under ``out_base`` is continued in its
    folder and ``on_resume`` gets the folder and the record of the reopening; Ctrl-C or SIGTERM stop the run as an
    ``Interrupted`` naming the folder."""
    target = target or Target.current()
    why = validate(request, target)
    cfg, dtype, device = request.config, request.dtype, target.device
    meta = describe(target.interpreter)
    key = request_key(step_request(request, meta["device_name"], target.interpreter))
    resumable = find_resumable(out_base, key) if resume else None  # refuses a folder a live process writes
    meta.update(kind="step", model=cfg.name, dtype=dtype, config=asdict(cfg), paths=list(request.paths),
                vs=request.vs, points=[asdict(p) for p in request.points], allreduce_gbps=request.allreduce_gbps,
                allreduce_latency_us=request.allreduce_latency_us, stack_layers=request.stack_layers,
                seed=request.seed, configs_dir=request.configs_dir,
                tile_fields=dict(request.tile_fields) or None, timing_method=run_method(target.interpreter),
                counts=part_counts(cfg), request=key)
    ceilings = None
    if device.type == "cuda" and not target.interpreter:
        ceilings = measure_ceilings()
        meta["ceilings"] = ceilings.as_dict()
    ensure_out_dir(out_base)
    model = Model(cfg, dtype, device, request.seed, request.stack_layers)
    counts = part_counts(cfg)
    base = {"model": cfg.name, "dtype": dtype, "interpreter": target.interpreter, "device": meta["device_name"]}
    writer = RunWriter(resumable or new_run_dir(out_base, f"step-{cfg.name.replace('/', '-')}-{dtype}"), meta,
                       resume=resumable is not None, columns=STEP_COLUMNS)
    rows = list(writer.kept)
    done = {step_identity(r) for r in rows}
    stopped: BaseException | None = None

    def keep(row: dict) -> None:
        writer.append(row)
        rows.append(row)
        if on_row:
            on_row(row)

    def left(point: StepPoint, part: str, path: str | None = None) -> bool:
        return (point.phase, point.batch, point.length, part, path) not in done

    try:
        if writer.resumed and on_resume:
            on_resume(writer.run_dir, writer.resumed)
        for point in request.points:
            at = blank_row(**base, phase=point.phase, batch=point.batch, length=point.length, tokens=point.tokens)
            attn, router, moe, shared = model.layers[0]
            parts = [attn, router, shared, model.dense, model.head]
            for part in (p for p in parts if p is not None and left(point, p.part)):
                prepared = part.prepare(point)
                keep(measure_part(prepared, {**at, "count": counts[prepared.part]}, target, ceilings))
                del prepared
            todo = [name for name in request.paths if left(point, "moe", name)]
            inputs = moe.inputs(point) if todo else None
            ref = None
            for name in todo:
                row = {**at, "part": "moe", "path": name, "count": counts["moe"], "measured": True}
                if why[(name, point)]:
                    keep({**row, "status": "unsupported", "error": why[(name, point)]})
                    continue
                if ref is None and not get_path(name).baseline:
                    ref = moe.reference(inputs)
                keep(measure_part(moe.prepare(point, name, inputs, ref, request.tiles), row, target, ceilings))
            del inputs, ref
            if left(point, "allreduce"):
                modelled = allreduce_row(cfg, point, cfg.name, dtype, get_dtype(dtype).act_bytes,
                                         request.allreduce_gbps, request.allreduce_latency_us)
                keep(modelled | {k: base[k] for k in ("interpreter", "device")})
            name = stack_path(request)
            if request.stack_layers and not why[(name, point)] and left(point, "stack", name):
                keep(_stack_row(model, request, point, at, target, rows))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    except BaseException as e:
        stopped = stopped_in(e, writer.run_dir)
        if stopped is e:
            raise
        raise stopped from e
    finally:
        writer.end(stopped)
    return writer.run_dir, rows


def _stack_row(model: Model, request: StepRequest, point: StepPoint, at: dict, target: Target,
               rows: list[dict]) -> dict:
    """The composition check at ``point``: the stack timed whole, beside the sum of its parts' rows."""
    name = stack_path(request)
    run, graph_safe, h = model.stack(point, name, request.tiles)
    t = time_closure(run, graph_safe, target)
    key = (at["model"], at["dtype"], point.phase, point.batch, point.length)
    layers = len(model.layers)
    note = (f"{layers} real consecutive MoE layers (attention, router, MoE, shared expert where the model has one) "
            "in one closure, with the residual adds the parts leave out")
    row = {**at, "part": "stack", "path": name, "count": 0, "measured": True, "stack_layers": layers,
           "parts_us": compose.stack_parts_us(rows, key, name, layers), "note": note}
    if not bool(torch.isfinite(h).all()):
        return {**row, "status": "incorrect", "correct": False, "error": "the stack's output is not finite"}
    return {**row, "status": "ok", "time_us": t.median_us, "time_p20_us": t.p20_us, "time_p80_us": t.p80_us,
            "reps": t.reps, "timing_method": t.method}
