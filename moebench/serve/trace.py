"""A JIT audit by replaying serving traffic: a stream of requests' token counts through the MoE layer on the
triton path, counting the kernel variants Triton builds for each request and what they cost it.

In serving, a kernel that specializes on the token count recompiles when a new count arrives, and the GPU
that stops to compile holds the others. moebench's kernels mark token counts ``do_not_specialize``, so a
replay should build a handful of variants early (one per tile config and per shape-derived flag) and none
later. Per request: the first (cold) call's latency, the median of a few repeats (warm), the difference
(excess) and the variants built (``jit_watch.CompileWatch``).

The replay runs in a child process (multiprocessing spawn) whose TRITON_CACHE_DIR is set before it starts:
its in-memory caches start empty and its on-disk cache is a fresh temporary folder (cold), or a folder the
user names (``cache_dir``), which ``moebench warmup`` may fill first (``warmup``). With ``warmup`` the replay
process first runs each (M, config) of the warmup plan once (``startup``), as a server's start-up warm-up runs
the layer: the kernels the disk cache holds are loaded into the process then, not during the first requests.

The run folder is written as a sweep's is (``store.runfolder.RunWriter``): a stopped trace started again
continues in its folder and replays only the requests it lacks, in a new process whose caches start as the
request says, so its cold-start figures count one cold start per replay process (``run_trace``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, is_dataclass, replace
from pathlib import Path

import numpy as np

from moebench.errors import UserError, one_line
from moebench.models import MoEShape
from moebench.store.rows import TRACE_REQUEST_COLUMNS
from moebench.tile import TileConfig

STARTUP_KEYS = ("startup_s", "startup_kernels", "startup_from_disk", "startup_runs", "startup_failures")
WARM_CALLS = 5  # repeats of each request, all kernels compiled, whose median is its warm time


# ---- replay ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReplayResult:
    """A replay's rows (one dict per request: ``store.rows.TRACE_REQUEST_COLUMNS`` and the compile details) and
    how it counted."""

    rows: list[dict]
    method: str  # CompileWatch.method: "hooks", "caches" or "interpreter"
    interpreter: bool
    setup_s: float  # weights and the device's set-up, before the first request
    startup: dict | None = None  # the start-up pass's figures (``_startup``), None where none ran


def _timed_ms(run: Callable, out, cuda: bool) -> float:
    """Wall time of one call of ``run(out)`` in ms, the device synchronized before and after."""
    import torch

    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    run(out)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def replay(shape: MoEShape, dtype: str, counts: list[int], configs_dir: Path | str | None = None,
           specialize: bool = False, cache_dir: Path | str | None = None, seed: int = 0,
           warm_calls: int | None = None, on_row: Callable[[dict], None] | None = None,
           startup: list[tuple[int, TileConfig]] | None = None, skip: Collection[int] = ()) -> ReplayResult:
    """Replay ``counts`` through the MoE layer on the triton path, in this process, each request at the tile
    config ``lookup.choose`` gives for its M. ``cache_dir``: TRITON_CACHE_DIR for the replay (restored
    after). ``specialize``: with the kernels' token-count specializing twins (``jit_watch.specialized``).
    ``warm_calls``: repeats per request (default WARM_CALLS, 1 on the interpreter). ``startup``: (M, config)
    pairs run once each before the first request (``_startup``), outside the rows. ``skip``: the indices of
    requests not replayed (a resumed trace has their rows); the others keep their index and inputs."""
    from contextlib import nullcontext

    import torch

    from moebench.environment import device_name
    from moebench.paths.base import Target
    from moebench.paths.triton_path import TritonPath
    from moebench.problem import Problem, make_inputs, make_weights
    from moebench.serve.jit_watch import CompileWatch, specialized
    from moebench.serve.triton_cache import cache_dir as triton_cache_dir
    from moebench.serve.triton_cache import cache_dir_env
    from moebench.tables import lookup

    started = time.perf_counter()
    target, path, device = Target.current(), TritonPath(), device_name()
    check_request(TraceRequest(shape, dtype, tuple(counts), ""))
    cuda = target.device.type == "cuda" and not target.interpreter
    warm_calls = warm_calls or (1 if target.interpreter else WARM_CALLS)
    rows: list[dict] = []
    with cache_dir_env(cache_dir):
        weights = make_weights(shape, dtype, seed, target.device)
        if cuda:  # Triton's driver set-up and the CUDA context: once per process, before any request
            from triton.runtime import driver

            driver.active.get_current_target()
            torch.cuda.synchronize()
        setup_s = time.perf_counter() - started
        with (specialized() if specialize else nullcontext()):
            started_up = None if startup is None else _startup(startup, shape, dtype, seed, weights, cuda)
            watch = CompileWatch(cache_dir=triton_cache_dir(), interpreter=target.interpreter)
            with watch:
                for i, M in enumerate(counts):
                    if i in skip:
                        continue
                    problem = Problem(shape, M, dtype, seed=seed)
                    chosen = lookup.choose(M, shape.experts, shape.intermediate, dtype, device,
                                           path.default_config(problem), configs_dir, hidden=shape.hidden,
                                           topk=shape.topk)
                    inputs = make_inputs(problem, target.device, weights, draw=i)
                    run = path.prepare(inputs, problem, chosen.config)
                    out = torch.empty(M, shape.hidden, device=target.device, dtype=problem.spec.act)  # [M, hidden]
                    watch.begin(i)
                    latency = _timed_ms(run, out, cuda)
                    warm = float(np.median([_timed_ms(run, out, cuda) for _ in range(warm_calls)]))
                    rows.append(_request_row(i, M, chosen, latency, warm, watch.end(), watch))
                    if on_row is not None:
                        on_row(rows[-1])
    return ReplayResult(rows, watch.method, target.interpreter, setup_s, started_up)


def _startup(items: list[tuple[int, TileConfig]], shape: MoEShape, dtype: str, seed: int, weights,
             cuda: bool) -> dict:
    """Each (M, config) of ``items`` run once, as a serving process's start-up warm-up runs the layer: the
    kernels Triton's disk cache holds are loaded into this process (those it lacks compiled) before the first
    request. What meta.json records of it: its seconds, the kernels built (None on the interpreter) and how
    many of them came from disk (None where the count cannot tell), the runs, and those that could not run."""
    import torch

    from moebench.paths.base import Target
    from moebench.paths.triton_path import TritonPath
    from moebench.problem import Problem, make_inputs
    from moebench.serve.jit_watch import CompileWatch
    from moebench.serve.triton_cache import cache_dir as triton_cache_dir

    target, path, failures = Target.current(), TritonPath(), []
    started = time.perf_counter()
    with CompileWatch(cache_dir=triton_cache_dir(), interpreter=target.interpreter) as watch:
        watch.begin(-1)
        for M, config in items:
            problem = Problem(shape, M, dtype, seed=seed)
            try:
                run = path.prepare(make_inputs(problem, target.device, weights), problem, config)
                run(torch.empty(M, shape.hidden, device=target.device, dtype=problem.spec.act))
            except Exception as e:  # noqa: BLE001 - listed: the request that needs this config says more
                failures.append(f"M={M} {config.label}: {one_line(e)}")
        if cuda:
            torch.cuda.synchronize()
        events = watch.end()
    disk = None if events is None or any(e.from_disk is None for e in events) else sum(e.from_disk for e in events)
    return {"startup_s": time.perf_counter() - started, "startup_kernels": None if events is None else len(events),
            "startup_from_disk": disk, "startup_runs": len(items), "startup_failures": failures}


def _request_row(i: int, M: int, chosen, latency: float, warm: float, events, watch) -> dict:
    """One request's row; where the count came from cache sizes (untimed), each compile's seconds are the
    request's excess shared among them."""
    excess = latency - warm
    row = {"i": i, "M": M, "config": chosen.config.label, "config_source": chosen.label, "latency_ms": latency,
           "warm_ms": warm, "excess_ms": excess}
    if events is None:  # the interpreter builds nothing: nothing counted, not zero
        return {**row, "compiles": None, "compile_kernels": None, "compile_s": None, "from_disk": None,
                "new_cache_entries": None}
    share = max(excess, 0.0) / 1e3 / len(events) if events else 0.0
    return {**row, "compiles": len(events), "compile_kernels": [e.kernel for e in events],
            "compile_s": [e.seconds if e.seconds is not None else share for e in events],
            "from_disk": [e.from_disk for e in events], "new_cache_entries": watch.new_cache_entries}


# ---- a trace: the run folder, the replay in a child process ---------------------------------------------

@dataclass(frozen=True)
class TraceRequest:
    """What ``run_trace`` replays, and how: plain data, so it can travel to the child process."""

    shape: MoEShape
    dtype: str
    counts: tuple[int, ...]  # the requests' token counts, in order
    distribution: str  # distribution_label, or "csv:<file>"
    seed: int = 0
    configs_dir: str | None = None  # --configs: tables the config per M is read from first
    cache_dir: str | None = None  # Triton's on-disk cache for the replay; None: a fresh temporary folder
    warmup: bool = False  # moebench.serve.warmup fills the cache folder before the replay
    # (M, config) run once each before the first request; run_trace sets the warmup plan's items here
    startup: tuple[tuple[int, TileConfig], ...] | None = None
    specialize: bool = False  # the kernels' token-count specializing twins
    warm_calls: int | None = None


def check_request(request: TraceRequest) -> None:
    """UserError where the triton path cannot run the request's shape and dtype here, or the table it would read
    its configs from is not one (before anything runs)."""
    from moebench.environment import device_name
    from moebench.paths.base import Target
    from moebench.paths.triton_path import TritonPath
    from moebench.problem import Problem, check_fits
    from moebench.tables import lookup

    if reason := TritonPath().supports(Problem(request.shape, 1, request.dtype, seed=request.seed), Target.current()):
        raise UserError(f"the triton path cannot run {request.shape.name} {request.dtype} here: {reason}")
    check_fits([Problem(request.shape, max(request.counts), request.dtype)], Target.current().device, reference=False)
    shape = request.shape
    lookup.find_table(shape.experts, shape.intermediate, device_name(), request.dtype, request.configs_dir)


@dataclass(frozen=True)
class TraceRun:
    """A finished trace: its folder, its rows (every request's, in order, those a resumed folder kept included)
    and its meta.json."""

    run_dir: Path
    rows: list[dict]
    meta: dict


def trace_request(request: TraceRequest, in_process: bool) -> dict:
    """What a trace is asked to do, as plain data for ``request_key``: the request, the device and where the
    replay runs; not where its folder goes, nor how progress shows."""
    from moebench._interpret import interpreting
    from moebench.environment import device_name

    return {"kind": "trace", "device": device_name(), "interpreter": interpreting(),
            "process": "this" if in_process else "child (spawn)", **asdict(request)}


def run_trace(request: TraceRequest, out_base: Path | str, on_row: Callable[[dict], None] | None = None,
              in_process: bool = False, warmup_jobs: int | None = None, resume: bool = True,
              on_resume: Callable[[Path, dict], None] | None = None,
              summarize: Callable[[list[dict]], dict] | None = None) -> TraceRun:
    """Replay ``request`` into a run folder under ``out_base`` (``<UTC>-trace-<model>-<dtype>``: meta.json,
    rows.jsonl with a row per request as it finishes). The replay runs in a spawned child process whose
    TRITON_CACHE_DIR is the cache folder, so both of Triton's caches start as the request says; with
    ``in_process`` it runs here (tests: this process's in-memory caches may hold variants already). A
    temporary cache folder is removed after. Ctrl-C or SIGTERM raise ``Interrupted`` naming the folder, which
    records "interrupted"; another exception, "failed".

    With ``resume``, a stopped trace of the same request (``trace_request``) under ``out_base`` continues in
    its folder (``store.resume.find_resumable``): its rows are kept, only the requests it lacks are replayed,
    and ``on_resume`` gets the folder and the record of the reopening. The new replay process starts with the
    caches the request says (a temporary cache folder is empty again), so the requests after a restart pay a
    cold start again: a resumed trace's compile counts and excess are those of a server restarted there, not
    of one start. meta.json's ``replay_starts`` lists the first request each replay process ran ([0] for a
    trace that ran at one go), ``resumed`` each reopening, and ``summary`` what ``summarize`` makes of the rows
    (``report.trace_summary.summarize``, which the command passes in), where given."""
    from moebench._interpret import interpreting
    from moebench.environment import describe
    from moebench.store.resume import find_resumable, request_key, stopped_in
    from moebench.store.runfolder import RunWriter, new_run_dir

    key = request_key(trace_request(request, in_process))
    resumable = find_resumable(Path(out_base), key) if resume else None  # refuses a folder a live process writes
    temporary = request.cache_dir is None
    cache_dir = Path(tempfile.mkdtemp(prefix="moebench-trace-cache-") if temporary else request.cache_dir)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        warmed = None
        if request.warmup:
            warmed, items = _warmup(request, cache_dir, warmup_jobs)
            request = replace(request, startup=items)
        meta = {
            "kind": "trace", **describe(interpreting()),
            "model": request.shape.name, "shape": asdict(request.shape), "dtype": request.dtype,
            "distribution": request.distribution, "seed": request.seed, "requests": len(request.counts),
            "cache_mode": "warmup" if request.warmup else "cold" if temporary else "given",
            "cache_dir": "temporary, removed after" if temporary else str(cache_dir),
            "cache_entries_at_start": len(os.listdir(cache_dir)), "specialize": request.specialize,
            "configs_dir": request.configs_dir, "warmup": warmed,
            "process": "this" if in_process else "child (spawn)", "request": key,
        }
        name = f"trace-{request.shape.name.replace('/', '-')}-{request.dtype}"
        writer = RunWriter(resumable or new_run_dir(Path(out_base), name), meta, resume=resumable is not None,
                           columns=TRACE_REQUEST_COLUMNS)
        rows = sorted(writer.kept, key=lambda r: r["i"])
        replayed = frozenset(r["i"] for r in rows)
        first = next((i for i in range(len(request.counts)) if i not in replayed), len(request.counts))

        def keep(row: dict) -> None:
            writer.append(row)
            rows.append(row)
            if on_row is not None:
                on_row(row)

        try:
            writer.note(replay_starts=[*writer.meta.get("replay_starts", []), first])
            if writer.resumed and on_resume is not None:
                on_resume(writer.run_dir, writer.resumed)
            done = (_replay_here if in_process else _replay_child)(request, cache_dir, keep, replayed)
        except BaseException as e:
            stopped = stopped_in(e, writer.run_dir)
            writer.end(stopped)
            if stopped is e:
                raise
            raise stopped from e
        rows.sort(key=lambda r: r["i"])
        writer.end(None, **done, **({"summary": summarize(rows)} if summarize is not None else {}))
        return TraceRun(writer.run_dir, rows, writer.meta)
    finally:
        if temporary:
            shutil.rmtree(cache_dir, ignore_errors=True)


def _warmup(request: TraceRequest, cache_dir: Path, jobs: int | None) -> tuple[dict, tuple]:
    """``moebench.serve.warmup`` run into ``cache_dir`` for the request's shape and dtype, every launch up to its
    largest token count: its report and plan as plain data, and the plan's (M, config) items."""
    try:
        from moebench.serve import warmup
    except ModuleNotFoundError as e:
        if e.name != "moebench.serve.warmup":
            raise
        raise UserError("--warmup needs moebench.serve.warmup, which this moebench lacks") from None
    from moebench.workers.pools import default_jobs

    plan = warmup.plan_for_model(request.shape, request.dtype, configs_dir=request.configs_dir,
                                 max_tokens=max(request.counts))
    report = warmup.warm(plan, max(1, default_jobs()) if jobs is None else jobs, cache_dir=cache_dir)
    plain = asdict(report) if is_dataclass(report) else dict(vars(report))
    plain.update(source=plan.source, max_tokens=plan.max_tokens, m=[M for M, _ in plan.items])
    return json.loads(json.dumps(plain, default=str)), tuple(plan.items)


def _replay_here(request: TraceRequest, cache_dir: Path, keep: Callable[[dict], None],
                 skip: Collection[int] = ()) -> dict:
    """The replay in this process, less the requests ``skip`` names; what meta.json records of it."""
    done = replay(request.shape, request.dtype, list(request.counts), request.configs_dir, request.specialize,
                  cache_dir, request.seed, request.warm_calls, on_row=keep,
                  startup=None if request.startup is None else list(request.startup), skip=skip)
    return {"count_method": done.method, "interpreter": done.interpreter, "setup_s": done.setup_s,
            **(done.startup or dict.fromkeys(STARTUP_KEYS))}


def _child(request: TraceRequest, cache_dir: str, messages, skip: Collection[int]) -> None:
    """The spawned process: the replay, its rows and its end sent as ("row" | "done" | "user_error" |
    "error", payload)."""
    os.environ["TRITON_CACHE_DIR"] = cache_dir  # set by the parent already; before Triton compiles anything
    try:
        done = _replay_here(request, Path(cache_dir), lambda row: messages.put(("row", row)), skip)
        messages.put(("done", done))
    except UserError as e:
        messages.put(("user_error", str(e)))
    except BaseException:  # noqa: BLE001 - told to the parent, which raises it
        messages.put(("error", traceback.format_exc()))


def _replay_child(request: TraceRequest, cache_dir: Path, keep: Callable[[dict], None],
                  skip: Collection[int] = ()) -> dict:
    """The replay in a spawned child process started with TRITON_CACHE_DIR=cache_dir, less the requests ``skip``
    names; its rows passed to ``keep`` as they come. UserError where the child raised one; RuntimeError, with
    its traceback, for any other error, or where it ended without a word."""
    import multiprocessing
    import queue

    from moebench.serve.triton_cache import cache_dir_env

    spawn = multiprocessing.get_context("spawn")
    messages = spawn.Queue()
    child = spawn.Process(target=_child, args=(request, str(cache_dir), messages, skip), daemon=True)
    with cache_dir_env(cache_dir):  # the child's environment is this one at start
        child.start()
    try:
        while True:
            try:
                kind, payload = messages.get(timeout=1.0)
            except queue.Empty:
                if child.is_alive():
                    continue
                try:  # what it sent just before it ended
                    kind, payload = messages.get(timeout=2.0)
                except queue.Empty:
                    raise RuntimeError(f"the replay process ended (exit status {child.exitcode}) "
                                       "before it finished") from None
            if kind == "row":
                keep(payload)
            elif kind == "done":
                return payload
            elif kind == "user_error":
                raise UserError(payload)
            else:
                raise RuntimeError(f"the replay process failed:\n{payload}")
    finally:
        if child.is_alive():
            child.terminate()
        child.join(timeout=30)
