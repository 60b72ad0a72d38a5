"""moebench trace: the request streams, the summary, the compile counter (fed by hand), the specializing
twins, and a short replay on the interpreter through the library and the command, stopped and resumed."""

from __future__ import annotations

import json
import math
import sys
import types

import numpy as np
import pytest
from click.testing import CliRunner

import moebench
import moebench.serve
from moebench._interpret import interpreting
from moebench.cli.trace import trace as trace_command
from moebench.errors import UserError
from moebench.models import get_model
from moebench.report.trace_summary import EVENT_COLUMNS, events_table, summarize
from moebench.serve import streams, trace, triton_cache
from moebench.serve.jit_watch import (
    CompileWatch,
    declared_do_not_specialize,
    decorator_args,
    layer_kernels,
    specialized,
)
from moebench.store.resume import Interrupted
from moebench.store.rows import TRACE_REQUEST_COLUMNS
from moebench.tile import TileConfig

# ---- request streams ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", streams.DISTRIBUTIONS)
def test_counts_are_deterministic_for_a_seed(kind):
    assert streams.token_counts(kind, 200, seed=3) == streams.token_counts(kind, 200, seed=3)
    assert streams.token_counts(kind, 200, seed=3) != streams.token_counts(kind, 200, seed=4)


@pytest.mark.parametrize("kind", streams.DISTRIBUTIONS)
def test_counts_are_clipped_to_the_bounds(kind):
    counts = streams.token_counts(kind, 5000, seed=0, max_tokens=100)  # far below the lognormal's tail
    assert all(isinstance(m, int) and 1 <= m <= 100 for m in counts)
    assert max(counts) == 100, "draws above max_tokens end at max_tokens"


def test_lognormal_median_is_the_declared_one():
    counts = streams.token_counts("lognormal", 20000, seed=1)
    assert abs(np.median(counts) - streams.LOGNORMAL_MEDIAN) <= 0.05 * streams.LOGNORMAL_MEDIAN


def test_uniform_spans_the_range():
    counts = streams.token_counts("uniform", 20000, seed=1, max_tokens=50)
    assert set(counts) == set(range(1, 51))


def test_decode_mix_share_of_decode_batches():
    """The share of counts up to DECODE_MAX is the decode share plus the prompts that small (lognormal CDF)."""
    counts = streams.token_counts("decode-mix", 20000, seed=2)
    z = (math.log(streams.DECODE_MAX + 0.5) - math.log(streams.LOGNORMAL_MEDIAN)) / streams.LOGNORMAL_SIGMA
    small_prompts = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    expected = streams.DECODE_SHARE + (1 - streams.DECODE_SHARE) * small_prompts
    assert abs(np.mean(np.array(counts) <= streams.DECODE_MAX) - expected) < 0.015


def test_unknown_distribution_is_a_user_error():
    with pytest.raises(UserError, match="decode-mix"):
        streams.token_counts("zipf", 10)


@pytest.mark.parametrize("text, expected", [
    ("id,prompt_len,tokens\n1,30,7\n2,40,8\n", [30, 40]),  # prompt_len wins over an earlier numeric column
    ("id,Tokens\n5,9\n6,10\n", [9, 10]),  # tokens, any case
    ("user,len\nann,12\nbob,13\n", [12, 13]),  # no name matches: the first numeric column
])
def test_csv_column_choice(tmp_path, text, expected):
    path = tmp_path / "lens.csv"
    path.write_text(text)
    assert streams.read_prompt_lengths(path) == expected


@pytest.mark.parametrize("text, message", [
    (None, "cannot read"),  # no file
    ("", "cannot read"),  # empty
    ("user,name\nann,bob\n", "no column"),  # nothing numeric
    ("prompt_len\n30\n0\n", "line 3"),  # a count below 1, named by its line
    ("prompt_len\n30\nabc\n", "line 3"),
])
def test_bad_csv_is_one_line_user_error(tmp_path, text, message):
    path = tmp_path / "lens.csv"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UserError, match=message) as e:
        streams.read_prompt_lengths(path)
    assert "\n" not in str(e.value)


# ---- statistics -----------------------------------------------------------------------------------------

def _row(i, latency, warm, kernels=(), seconds=(), disk=()):
    return {"i": i, "M": 1 + i % 7, "config": "c", "config_source": "heuristic", "latency_ms": latency,
            "warm_ms": warm, "excess_ms": latency - warm, "compiles": len(kernels), "compile_kernels": list(kernels),
            "compile_s": list(seconds), "from_disk": list(disk), "new_cache_entries": 0}


def test_summary_from_rows():
    rows = [_row(i, float(i + 1), 0.5) for i in range(100)]  # latencies 1..100 ms
    rows[3] = _row(3, 4.0, 0.5, ["_gemm1_swiglu", "_gemm2_combine"], [1.0, 2.0], [False, True])
    rows[25] = _row(25, 26.0, 0.5, ["_gemm1_swiglu"], [0.5], [False])
    rows[40] = _row(40, 41.0, 45.0)  # warm slower than cold: no negative excess in the total
    s = summarize(rows)
    assert s["requests"] == 100 and s["distinct_m"] == 7
    assert s["variants_compiled"] == 3 and s["compiles_after_20"] == 1 and s["loaded_from_disk"] == 1
    assert s["latency_p50_ms"] == pytest.approx(50.5) and s["latency_p99_ms"] == pytest.approx(99.01)
    assert s["latency_max_ms"] == 100.0 and s["warm_max_ms"] == 45.0
    assert s["total_excess_s"] == pytest.approx(sum(max(r["excess_ms"], 0) for r in rows) / 1e3)
    events = events_table(rows)
    assert list(events.columns) == EVENT_COLUMNS
    assert list(events["i"]) == [3, 3, 25] and list(events["kernel"])[1] == "_gemm2_combine"


def test_summary_of_interpreter_rows_counts_nothing():
    rows = [{**_row(i, 2.0, 1.0), "compiles": None, "compile_kernels": None} for i in range(3)]
    s = summarize(rows)
    assert s["variants_compiled"] is None and s["compiles_after_20"] is None and s["loaded_from_disk"] is None
    assert events_table(rows).empty


# ---- the compile counter, fed by hand -------------------------------------------------------------------

def _hook_call(name, key):
    return dict(key=key, repr=f"{name}[num_warps=4](x: *fp16)", fn=types.SimpleNamespace(name=name),
                compile={"key": key}, is_manual_warmup=False, already_compiled=False)


def test_watch_counts_hook_pairs_and_tells_disk_loads(tmp_path, monkeypatch):
    from triton import knobs

    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: seen.append(kw["key"]))
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    previous = knobs.runtime.jit_cache_hook
    with CompileWatch(kernels={}, cache_dir=tmp_path, interpreter=False, use_hooks=True) as watch:
        assert watch.method == "hooks"
        watch.begin(7)
        knobs.runtime.jit_cache_hook(**_hook_call("_gemm1_swiglu", "k1"))
        (tmp_path / "ABC123").mkdir()  # a compile writes a new cache entry
        knobs.runtime.jit_post_compile_hook(**_hook_call("_gemm1_swiglu", "k1"))
        knobs.runtime.jit_cache_hook(**_hook_call("_gemm2_combine", "k2"))
        knobs.runtime.jit_post_compile_hook(**_hook_call("_gemm2_combine", "k2"))  # nothing new: from disk
        events = watch.end()
        watch.begin(8)
        assert watch.end() == []
    assert [(e.kernel, e.request, e.from_disk) for e in events] == [("_gemm1_swiglu", 7, False),
                                                                      ("_gemm2_combine", 7, True)]
    assert all(e.seconds is not None and e.seconds >= 0 for e in events)
    assert seen == ["k1", "k2"], "the hook installed before is still called"
    assert knobs.runtime.jit_cache_hook is previous and knobs.runtime.jit_post_compile_hook is None


def test_watch_falls_back_to_cache_sizes(tmp_path):
    kernel = types.SimpleNamespace(device_caches={0: ({"a": 1}, {}, None, None, None)})
    watch = CompileWatch(kernels={"_scatter_kernel": kernel}, cache_dir=tmp_path, interpreter=False,
                         use_hooks=False)
    with watch:
        watch.begin(0)
        kernel.device_caches[0][0].update(b=2, c=3)
        (tmp_path / "new").mkdir()
        events = watch.end()
    assert watch.method == "caches" and watch.new_cache_entries == 1
    assert [(e.kernel, e.request, e.seconds) for e in events] == [("_scatter_kernel", 0, None)] * 2


def test_watch_on_the_interpreter_counts_nothing():
    with CompileWatch(interpreter=True) as watch:
        watch.begin(0)
        assert watch.end() is None and watch.method == "interpreter"


# ---- specializing twins ---------------------------------------------------------------------------------

def test_twins_differ_only_in_do_not_specialize():
    import moebench.kernels.fused_moe as fm
    import moebench.kernels.gemm1 as g1

    originals = {n: k for n, k in layer_kernels().items() if declared_do_not_specialize(k)}
    assert {"_gemm1_swiglu", "_gemm2_combine", "_align_one_program"} <= set(originals)
    with specialized() as twins:
        assert set(twins) == set(originals)
        for name, twin in twins.items():
            assert declared_do_not_specialize(twin) == () and twin.fn is originals[name].fn
            before, after = decorator_args(originals[name]), decorator_args(twin)
            assert {k for k in before if before[k] != after[k]} == {"do_not_specialize"}
        assert fm._gemm1_swiglu is twins["_gemm1_swiglu"] and g1._gemm1_swiglu is twins["_gemm1_swiglu"]
    assert fm._gemm1_swiglu is originals["_gemm1_swiglu"] and g1._gemm1_swiglu is originals["_gemm1_swiglu"]


def test_twins_are_the_kernels_launched():
    """Inside the block the layer launches the twins (their pre-run hooks fire), never the originals."""
    from moebench.kernels.fused_moe import fused_moe
    from moebench.paths.triton_path import TritonPath
    from moebench.problem import Problem, make_inputs, make_weights

    shape, device = get_model("tiny"), "cpu" if interpreting() else "cuda"
    weights = make_weights(shape, "fp16", 0, device)
    originals = layer_kernels()
    launched, stale = [], []
    for k in originals.values():
        k.add_pre_run_hook(lambda *a, **kw: stale.append(1))
    try:
        with specialized() as twins:
            for name, twin in twins.items():
                twin.add_pre_run_hook(lambda *a, _n=name, **kw: launched.append(_n))
            for M in (3, 80):  # 6 slots: the one-program align; 160 slots: the count and scatter launches
                problem = Problem(shape, M, "fp16")
                x = make_inputs(problem, device, weights)
                fused_moe(x.x, weights.w13, weights.w2, x.topk_weights, x.topk_ids,
                          TritonPath().default_config(problem))
    finally:
        for k in originals.values():
            k.pre_run_hooks.pop()
    assert {"_align_one_program", "_count_kernel", "_scatter_kernel", "_gemm1_swiglu", "_gemm2_combine"} <= set(
        launched)
    assert not stale


# ---- replay on the interpreter --------------------------------------------------------------------------

def test_replay_writes_a_run_folder(tmp_path):
    request = trace.TraceRequest(get_model("tiny"), "fp16", (1, 5, 1, 30, 2), "test", seed=0)
    done = trace.run_trace(request, tmp_path, in_process=True, summarize=summarize)
    rows = [json.loads(line) for line in (done.run_dir / "rows.jsonl").read_text().splitlines()]
    meta = json.loads((done.run_dir / "meta.json").read_text())
    assert done.run_dir.name.endswith("-trace-tiny-fp16")
    assert [r["M"] for r in rows] == [1, 5, 1, 30, 2] and [r["i"] for r in rows] == list(range(5))
    for r in rows:
        assert set(TRACE_REQUEST_COLUMNS) <= set(r)
        assert r["excess_ms"] == pytest.approx(r["latency_ms"] - r["warm_ms"]) and r["warm_ms"] > 0
    if interpreting():  # the interpreter compiles nothing: nothing is counted
        assert all(r["compiles"] is None and r["compile_kernels"] is None for r in rows)
        assert meta["interpreter"] is True and meta["count_method"] == "interpreter"
    else:  # request 2 repeats request 0's M (and config): every variant it needs is built
        assert all(isinstance(r["compiles"], int) for r in rows) and rows[2]["compiles"] == 0
        assert meta["count_method"] == "hooks"
    assert meta["status"] == "complete" and meta["cache_mode"] == "cold" and meta["summary"]["requests"] == 5


def test_a_trace_stopped_part_way_resumes_in_its_folder(tmp_path):
    """Ctrl-C after the second request: the folder says interrupted; the same trace again continues in it,
    replays only the three requests it lacks (at their own index), keeps the rows it had byte for byte, and
    meta.json records the restart (replay_starts, resumed) and a summary of all five requests."""
    counts = (1, 5, 1, 30, 2)
    request = trace.TraceRequest(get_model("tiny"), "fp16", counts, "test")

    def ctrl_c(row):
        if row["i"] == 1:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as info:
        trace.run_trace(request, tmp_path, in_process=True, on_row=ctrl_c)
    run = info.value.run_dir
    meta = json.loads((run / "meta.json").read_text())
    kept = (run / "rows.jsonl").read_text()
    assert (meta["status"], meta["stopped_by"], meta["replay_starts"]) == ("interrupted", "SIGINT", [0])
    assert [json.loads(line)["i"] for line in kept.splitlines()] == [0, 1]

    seen, resumes = [], []
    done = trace.run_trace(request, tmp_path, in_process=True, on_row=seen.append,
                           on_resume=lambda d, r: resumes.append((d, r)), summarize=summarize)
    assert done.run_dir == run and list(tmp_path.iterdir()) == [run]
    assert [r["i"] for r in seen] == [2, 3, 4] and [r["M"] for r in seen] == list(counts[2:])
    ((where, record),) = resumes
    assert where == run and (record["previous_status"], record["rows_kept"]) == ("interrupted", 2)
    text = (run / "rows.jsonl").read_text()
    assert text.startswith(kept)
    rows = [json.loads(line) for line in text.splitlines()]
    assert [r["i"] for r in rows] == list(range(5)) and [r["M"] for r in rows] == list(counts)
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "complete" and "stopped_by" not in meta and meta["replay_starts"] == [0, 2]
    assert [(r["previous_status"], r["rows_kept"]) for r in meta["resumed"]] == [("interrupted", 2)]
    assert meta["summary"]["requests"] == 5 and [r["i"] for r in done.rows] == list(range(5))


def test_command_resumes_the_newest_stopped_trace_and_fresh_starts_a_new_one(tmp_path, monkeypatch):
    """The command stopped at its second request leaves a folder; with --fresh, stopped again, a second one
    (the first untouched); run plainly, it continues the newest and says so."""
    args = ["--model", "tiny", "--dtype", "fp16", "--requests", "3", "--max-tokens", "8", "--out", str(tmp_path),
            "--no-progress", "--in-process", "--format", "json"]
    real = trace._request_row

    def stop_at_second(i, *rest):
        if i == 1:
            raise KeyboardInterrupt
        return real(i, *rest)

    monkeypatch.setattr(trace, "_request_row", stop_at_second)
    assert CliRunner().invoke(trace_command, args).exit_code != 0
    (first,) = tmp_path.iterdir()
    assert CliRunner().invoke(trace_command, [*args, "--fresh"]).exit_code != 0
    (second,) = set(tmp_path.iterdir()) - {first}
    for run in (first, second):
        assert json.loads((run / "meta.json").read_text())["status"] == "interrupted"
        assert len((run / "rows.jsonl").read_text().splitlines()) == 1

    monkeypatch.setattr(trace, "_request_row", real)
    result = CliRunner().invoke(trace_command, args)
    assert result.exit_code == 0, result.output
    assert f"resuming {second}: 1 requests kept (previous status: interrupted)" in result.stderr
    out = json.loads(result.stdout)
    assert out["run"] == str(second) and out["summary"]["requests"] == 3
    assert json.loads((first / "meta.json").read_text())["status"] == "interrupted"
    assert len((second / "rows.jsonl").read_text().splitlines()) == 3


def test_command_replays_in_a_child_process(tmp_path):
    result = CliRunner().invoke(trace_command, ["--model", "tiny", "--dtype", "fp16", "--requests", "2",
                                                "--max-tokens", "8", "--out", str(tmp_path), "--no-progress",
                                                "--format", "json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    meta = json.loads((tmp_path / out["run"].rsplit("/", 1)[-1] / "meta.json").read_text())
    assert meta["process"] == "child (spawn)" and meta["status"] == "complete"
    assert out["summary"]["requests"] == 2
    if interpreting():
        assert out["count_method"] == "interpreter" and "compiles nothing" in result.stderr
    else:  # the child starts with empty caches: its first request builds the layer's kernels
        assert out["count_method"] == "hooks" and out["summary"]["variants_compiled"] > 0
        assert {"_gemm1_swiglu", "_gemm2_combine"} <= {e["kernel"] for e in out["events"]}


def test_command_warmup_fills_the_cache_folder_first(tmp_path, monkeypatch):
    """The stand-in warmup is asked for every launch up to the largest request; the replay process then runs
    its plan's item once before the first request, and meta.json says so."""
    calls = {}
    fake = types.ModuleType("moebench.serve.warmup")
    item = (1, TileConfig(16, 32, 32, 1, 2, 2))

    def plan_for_model(shape, dtype, configs_dir=None, max_tokens=4096):
        calls.update(max_tokens=max_tokens)
        return types.SimpleNamespace(name=shape.name, dtype=dtype, source="fake", max_tokens=max_tokens, items=(item,))

    def warm(plan, jobs, cache_dir=None):
        calls.update(plan=(plan.name, plan.dtype), cache_dir=str(cache_dir))
        return types.SimpleNamespace(configs=2, kernels=6, seconds=1.5, cache_dir=str(cache_dir), failures=[],
                                     interpreter=True)
    fake.plan_for_model, fake.warm = plan_for_model, warm
    monkeypatch.setitem(sys.modules, "moebench.serve.warmup", fake)
    # `from moebench.serve import warmup` looks at the package first
    monkeypatch.setattr(moebench.serve, "warmup", fake, raising=False)
    cache = tmp_path / "cache"
    result = CliRunner().invoke(trace_command, ["--model", "tiny", "--dtype", "fp16", "--requests", "3",
                                                "--max-tokens", "40", "--out", str(tmp_path),
                                                "--no-progress", "--warmup", "--cache-dir", str(cache),
                                                "--in-process", "--format", "csv", "--table", "requests"])
    assert result.exit_code == 0, result.output
    meta = json.loads(next(tmp_path.glob("*-trace-*/meta.json")).read_text())
    rows = [json.loads(line) for line in next(tmp_path.glob("*-trace-*/rows.jsonl")).read_text().splitlines()]
    assert calls == {"max_tokens": max(r["M"] for r in rows), "plan": ("tiny", "fp16"),
                     "cache_dir": str(cache.resolve())}
    assert meta["cache_mode"] == "warmup" and meta["warmup"]["kernels"] == 6 and meta["warmup"]["m"] == [1]
    assert meta["startup_runs"] == 1 and meta["startup_failures"] == [] and meta["startup_s"] > 0
    assert "start-up pass: 1 launch in " in result.stderr
    assert result.stdout.splitlines()[0] == ",".join(TRACE_REQUEST_COLUMNS)


def test_warmup_startup_runs_the_plan_before_the_first_request(tmp_path, monkeypatch):
    """In-process replay with the real warmup (in this process): every layer call is recorded; the plan's
    (M, config) come first, once each, then the requests; their figures are in meta.json, not in the rows."""
    from moebench.paths.triton_path import TritonPath
    from moebench.serve.warmup import plan_for_model
    from moebench.workers import jobs

    monkeypatch.setattr(jobs, "first_run", lambda path_name, problem, config: jobs.RAN)  # warm: no calls
    prepared, real = [], TritonPath.prepare

    def recorded(self, inputs, problem, config):
        prepared.append((problem.M, config))
        return real(self, inputs, problem, config)

    monkeypatch.setattr(TritonPath, "prepare", recorded)
    counts = (3, 70, 45)
    request = trace.TraceRequest(get_model("tiny"), "fp16", counts, "test", warmup=True,
                                 cache_dir=str(tmp_path / "cache"))
    done = trace.run_trace(request, tmp_path / "out", in_process=True, warmup_jobs=0, summarize=summarize)
    plan = plan_for_model(get_model("tiny"), "fp16", max_tokens=70)
    assert len(plan.items) > 1 and {M for M, _ in plan.items} != set(counts)
    n = len(plan.items)
    assert prepared[:n] == list(plan.items)
    assert [M for M, _ in prepared[n:]] == list(counts) and [r["M"] for r in done.rows] == list(counts)
    meta = json.loads((done.run_dir / "meta.json").read_text())
    assert set(trace.STARTUP_KEYS) <= set(meta) and meta["startup_runs"] == n and meta["startup_failures"] == []
    assert meta["startup_s"] > 0 and meta["warmup"]["max_tokens"] == 70
    assert meta["warmup"]["m"] == [M for M, _ in plan.items] and meta["summary"]["requests"] == len(counts)
    if interpreting():
        assert meta["startup_kernels"] is None and meta["startup_from_disk"] is None
    else:
        assert isinstance(meta["startup_kernels"], int)


def test_a_startup_config_that_cannot_run_is_listed_and_the_replay_goes_on():
    bad = TileConfig(16, 64, 128, gemm1_quant_x=True, direct_route=True)  # for fp8-block128 only
    good = TileConfig(16, 32, 32, 1, 2, 2)
    done = trace.replay(get_model("tiny"), "fp16", [2], startup=[(1, good), (4, bad)])
    (failure,) = done.startup["startup_failures"]
    assert failure.startswith(f"M=4 {bad.label}: ") and "gemm1_quant_x" in failure
    assert done.startup["startup_runs"] == 2 and [r["M"] for r in done.rows] == [2]


def test_warmup_startup_travels_to_the_child_process(tmp_path):
    """The plan's configs reach the spawned replay process, which runs them before the first request."""
    request = trace.TraceRequest(get_model("tiny"), "fp16", (2, 9), "test", warmup=True,
                                 cache_dir=str(tmp_path / "cache"))
    done = trace.run_trace(request, tmp_path / "out", warmup_jobs=0)
    meta = json.loads((done.run_dir / "meta.json").read_text())
    assert meta["process"] == "child (spawn)" and meta["status"] == "complete"
    assert meta["startup_runs"] == len(meta["warmup"]["m"]) >= 1 and meta["startup_failures"] == []
    assert meta["warmup"]["max_tokens"] == 9 and meta["warmup"]["interpreter"] is interpreting()


def test_a_cold_trace_records_no_startup(tmp_path):
    request = trace.TraceRequest(get_model("tiny"), "fp16", (2,), "test")
    done = trace.run_trace(request, tmp_path, in_process=True, summarize=summarize)
    assert all(done.meta[k] is None for k in trace.STARTUP_KEYS) and done.meta["warmup"] is None


@pytest.mark.parametrize("args, message, interpreter_only", [
    (["--model", "deepseek-v3"], "tiny shapes only", True),
    (["--model", "tiny", "--csv", "missing.csv"], "cannot read", False),
    (["--model", "tiny", "--dtype", "bf16"], "bf16", True),  # the interpreter's bf16 dot is wrong
])
def test_command_refuses_before_writing(tmp_path, args, message, interpreter_only):
    if interpreter_only and not interpreting():
        pytest.skip("a refusal of the interpreter")
    result = CliRunner().invoke(trace_command, [*args, "--out", str(tmp_path / "out"), "--no-progress"])
    assert isinstance(result.exception, UserError) and message in str(result.exception)
    assert not (tmp_path / "out").exists()


def test_cache_env_is_restored(monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/before")
    with triton_cache.cache_dir_env("/during"):
        assert triton_cache.cache_dir().as_posix() == "/during"
    assert triton_cache.cache_dir().as_posix() == "/before"
