"""moebench bounds: the points chosen from run folders, the bound's arithmetic, the measuring code on tiny
shapes (the CPU's wall clock stands in for the GPU timer), the run folder it writes, and the CLI's refusals."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import moebench_in_process

from moebench.errors import UserError
from moebench.measure.roofline import Ceilings, floor
from moebench.models import MoEShape
from moebench.probes import bounds_measure as bm
from moebench.probes.bounds import (
    BOUND_COLUMNS,
    GemmShape,
    bound_fields,
    bounds_table,
    choose_points,
    dense_gemm_bytes,
    dense_gemm_flops,
    dense_gemm_shapes,
    load_points,
    mixing_warnings,
    problem_of,
    summarize,
    summary_line,
)
from moebench.problem import Problem
from moebench.store.runfolder import ROW_COLUMNS, RunWriter, load_run

ROOT = Path(__file__).resolve().parent.parent
CEIL = Ceilings(copy_gbps=4000.0, read_gbps=4500.0, bf16_tflops=800.0, fp8_tflops=1500.0)
TINY = MoEShape("tiny", experts=8, hidden=64, intermediate=32, topk=2)  # every size a multiple of 16 (fp8)
GPU = "NVIDIA H200"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # Triton's readers run on the GPU, or the interpreter
METHOD = "cuda-graph replay, L2 emptied before each replay (a read of 4x its size), median"


def row(M=1, dtype="bf16", path="triton", time_us=10.0, shape=TINY, **kw) -> dict:
    """A result row of a GPU run, every column present, its bytes and FLOPs those of its problem."""
    problem = Problem(shape, M, dtype)
    touched = kw.pop("experts_touched", min(shape.experts, M * shape.topk))
    r = {c: None for c in ROW_COLUMNS}
    r.update(model=shape.name, experts=shape.experts, hidden=shape.hidden, intermediate=shape.intermediate,
             topk=shape.topk, moe_layers=shape.moe_layers, M=M, dtype=dtype, path=path, routing="uniform", seed=0,
             status="ok", correct=True, rel_err=1e-3, time_us=time_us, flops=problem.flops,
             bytes=problem.min_bytes(touched), experts_touched=touched, device_name=GPU, interpreter=False,
             timing_method=METHOD)
    r.update(kw)
    return r


def write_run(folder: Path, rows: list[dict], interpreter: bool = False) -> Path:
    writer = RunWriter(folder, {"interpreter": interpreter, "ceilings": CEIL.as_dict()})
    for r in rows:
        writer.append(r)
    writer.finish()
    return folder


# ---- choosing the points ------------------------------------------------------------------------------

def test_the_fastest_correct_row_of_the_path_per_point():
    """A tuned run holds a row per config: the fastest correct one is the point's; a faster wrong row, a
    failed row and another path's faster row are not."""
    df = pd.DataFrame([
        row(M=1, time_us=12.0, config={"BLOCK_SIZE_M": 16}),
        row(M=1, time_us=9.0, config={"BLOCK_SIZE_M": 32}),  # the best of M=1
        row(M=1, time_us=5.0, correct=False, status="incorrect"),  # faster, wrong: never best
        row(M=1, time_us=4.0, path="cutlass"),  # another path
        row(M=1, time_us=3.0, status="error", correct=None),
        row(M=4, time_us=20.0),
        row(M=4, dtype="fp8-tensor", time_us=15.0),  # a dtype is its own point
        row(M=4, time_us=18.0, routing="skewed", experts_touched=3),  # a routing touches other experts
    ])
    points = choose_points(df)
    got = [(r["dtype"], r["M"], r["routing"], r["time_us"]) for r in points.to_dict("records")]
    assert got == [("bf16", 1, "uniform", 9.0), ("bf16", 4, "skewed", 18.0), ("bf16", 4, "uniform", 20.0),
                   ("fp8-tensor", 4, "uniform", 15.0)]
    assert choose_points(df, "cutlass")["time_us"].tolist() == [4.0]


def test_no_rows_of_the_path_is_a_user_error_naming_the_paths_there():
    df = pd.DataFrame([row(path="cutlass"), row(path="triton", status="unsupported", time_us=None)])
    with pytest.raises(UserError, match="path 'torch' in runs/x; paths with ok rows there: cutlass"):
        choose_points(df, "torch", "runs/x")


def test_load_points_takes_runs_together_and_names_each_row_s_run(tmp_path):
    a = write_run(tmp_path / "a", [row(M=1, time_us=12.0), row(M=4, time_us=20.0)])
    b = write_run(tmp_path / "b", [row(M=1, time_us=11.0)])
    points, warnings = load_points([a, b])
    assert warnings == []
    assert [(r["M"], r["time_us"], r["run"]) for r in points.to_dict("records")] == [
        (1, 11.0, str(b)), (4, 20.0, str(a))]


def test_load_points_refuses_an_interpreter_run_and_a_folder_that_is_not_a_run(tmp_path):
    cpu = write_run(tmp_path / "cpu", [row(interpreter=True, device_name="cpu (x86_64)")], interpreter=True)
    with pytest.raises(UserError, match="interpreter \\(CPU\\) run"):
        load_points([cpu])
    with pytest.raises(UserError, match="not a moebench run folder"):
        load_points([tmp_path])


# ---- the arithmetic --------------------------------------------------------------------------------------

def test_a_row_s_problem_has_its_bytes_and_flops():
    """The floor's bytes are the row's: the read bound reads what the floor counts."""
    shape = MoEShape("deepseek-v3@tp8", experts=256, hidden=7168, intermediate=256, topk=8, moe_layers=58)
    r = row(M=16, dtype="fp8-block128", shape=shape, experts_touched=100)
    p = problem_of(r)
    assert p.shape == shape and p.min_bytes(100) == r["bytes"] and p.flops == r["flops"]


@pytest.mark.parametrize("M, dtype, rows", [
    (5, "bf16", 10),  # M * topk rows, as they are
    (5, "fp8-tensor", 16),  # fp8: rounded up to 16 for _scaled_mm
    (8, "fp8-channel", 16),  # already a multiple of 16
])
def test_dense_gemm_shapes_flops_and_bytes(M, dtype, rows):
    p = Problem(TINY, M, dtype)
    g1, g2 = dense_gemm_shapes(p)
    assert (g1, g2) == (GemmShape(rows, 2 * 32, 64), GemmShape(rows, 64, 32))  # x @ w13.T, h @ w2.T
    assert dense_gemm_flops((g1, g2)) == p.flops * rows // (M * TINY.topk)
    w, a = (1, 2) if dtype.startswith("fp8") else (2, 2)  # operand and output bytes per element
    assert dense_gemm_bytes((g1, g2), dtype) == (
        (rows * 64 + 64 * 64) * w + rows * 64 * a + (rows * 32 + 64 * 32) * w + rows * 64 * a)


@pytest.mark.parametrize("read_us, gemm_us, bound_by", [
    (8.0, 5.0, "read"),  # decode: the read is the slower
    (8.0, 16.0, "gemm"),  # prefill: cuBLAS's GEMMs are the slower
    (8.0, 8.0, "read"),  # a tie is named read
])
def test_the_bound_is_the_slower_and_ratios_come_from_the_floor(read_us, gemm_us, bound_by):
    f = bound_fields(layer_us=20.0, floor_us=4.0, read_us=read_us, gemm_us=gemm_us)
    bound = max(read_us, gemm_us)
    assert f["bound_us"] == bound and f["bound_by"] == bound_by
    assert f["layer_pct"] == pytest.approx(20.0) and f["bound_pct"] == pytest.approx(400.0 / bound)
    assert f["read_pct"] == pytest.approx(50.0) and f["gemm_pct"] == pytest.approx(400.0 / gemm_us)
    assert f["layer_of_bound"] == pytest.approx(bound / 20.0)  # 1.0: the layer at its bound


def test_summary_geometric_means_lowest_and_points_under_60():
    rows = [
        {"model": "a", "dtype": "bf16", "M": 1, "routing": "uniform", **bound_fields(20.0, 10.0, 12.5, 5.0)},
        {"model": "a", "dtype": "bf16", "M": 4, "routing": "uniform", **bound_fields(25.0, 10.0, 20.0, 5.0)},
        {"model": "a", "dtype": "bf16", "M": 8, "routing": "uniform", "error": "out of memory"},
    ]
    s = summarize(rows)
    assert s["points"] == 2 and s["not_measured"] == ["a bf16 M=8"]
    assert s["bound_pct"]["geomean"] == pytest.approx(math.sqrt(80.0 * 50.0))
    assert (s["bound_pct"]["lowest"], s["bound_pct"]["lowest_at"]) == (50.0, "a bf16 M=4")
    assert s["layer_of_bound"]["geomean"] == pytest.approx(math.sqrt(12.5 / 20.0 * 20.0 / 25.0))
    assert s["bound_under_60"] == ["a bf16 M=4"]
    line = summary_line(s)
    assert line.startswith("2 points, geometric means: bound 63.2% (lowest 50.0%, a bf16 M=4) of floor")
    assert "not measured: a bf16 M=8" in line and "\n" not in line
    assert summary_line(summarize(rows[2:])).startswith("no bound measured")


def test_mixing_warnings_name_another_gpu_and_another_timing_method():
    points = pd.DataFrame([row(), row(M=4, device_name="NVIDIA H100 80GB HBM3", timing_method="eager")])
    w = mixing_warnings(points, GPU, METHOD)
    assert len(w) == 2 and "NVIDIA H100 80GB HBM3" in w[0] and "eager" in w[1]
    assert mixing_warnings(points.iloc[:1], GPU, METHOD) == []


# ---- measuring, on the CPU's wall clock ------------------------------------------------------------------

def test_every_reader_reads_the_whole_buffer():
    """The readers' sums are the buffer's: each read all of it (what the bare read checks before timing)."""
    buf = torch.rand(10_000, dtype=torch.bfloat16, device=DEVICE)  # not a multiple of any block: the tails are read too
    want = buf.sum(dtype=torch.float64).item()
    readers = bm.readers(buf, sms=2)
    assert len(readers) == 1 + len(bm.READ_PROGRAMS_PER_SM) * len(bm.READ_BLOCKS)
    for name, (fn, result) in readers.items():
        result.fill_(float("nan"))
        fn()
        assert result.sum(dtype=torch.float64).item() == pytest.approx(want, rel=bm.READ_RTOL), name


def test_bare_read_times_every_reader_and_keeps_the_fastest(monkeypatch):
    times = iter(range(100, 0, -1))  # each reader timed later reads faster: the last one wins
    timed = []

    def timer(fn):
        timed.append(fn)
        return float(next(times))

    name, us = bm.bare_read(1 << 12, DEVICE, timer, sms=1)
    assert len(timed) == 1 + len(bm.READ_PROGRAMS_PER_SM) * len(bm.READ_BLOCKS)
    assert name == f"read_all p{bm.READ_PROGRAMS_PER_SM[-1]} b{bm.READ_BLOCKS[-1]}" and us == 100 - len(timed) + 1


def test_a_reader_that_skips_bytes_is_not_timed(monkeypatch):
    def short(buf, sms):
        partial = torch.empty(1)
        return {"half": (lambda: partial.fill_(buf[: buf.numel() // 2].float().sum()), partial)}

    monkeypatch.setattr(bm, "readers", short)
    with pytest.raises(RuntimeError, match="reader half summed"):
        bm.bare_read(1 << 12, "cpu", lambda fn: pytest.fail("timed"), sms=1)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32", "fp8-tensor", "fp8-block128"])
def test_dense_gemms_match_float32(dtype):
    """Both products written (outputs poisoned first) and within the check's tolerance; fp8 uses _scaled_mm."""
    shapes = dense_gemm_shapes(Problem(TINY, 5, dtype))
    try:
        run, err = bm.dense_gemms(shapes, dtype, "cpu")
    except (RuntimeError, NotImplementedError) as e:
        if dtype.startswith("fp8"):
            pytest.skip(f"torch._scaled_mm needs a GPU in this torch: {e}")
        raise
    assert err <= 5e-3  # bf16 output rounding; fp8 operands are the same on both sides
    run()  # the closure runs again (it is what the timer replays)


def counting_timer(read_us: float, gemm_us: float):
    """A timer that runs each closure once and says ``read_us`` until a GEMM closure comes, then ``gemm_us``."""
    def timer(fn):
        fn()
        return gemm_us if getattr(fn, "__name__", "") == "run" else read_us
    return timer


@pytest.mark.parametrize("M, dtype, read_us, gemm_us, bound_by", [
    (1, "bf16", 30.0, 10.0, "read"),  # decode-like: the read binds
    (64, "fp16", 30.0, 50.0, "gemm"),  # prefill-like: the GEMMs bind
])
def test_measure_point_places_the_layer_against_its_bound(M, dtype, read_us, gemm_us, bound_by):
    point = {**row(M=M, dtype=dtype, time_us=60.0), "run": "runs/a"}
    out = bm.measure_point(point, CEIL, DEVICE, counting_timer(read_us, gemm_us), sms=1)
    fl = floor(problem_of(point), point["experts_touched"], CEIL)
    assert out["error"] is None and out["bound_by"] == bound_by and out["run"] == "runs/a"
    assert out["floor_us"] == pytest.approx(fl.floor_us) and out["layer_us"] == 60.0
    assert out["bound_us"] == max(read_us, gemm_us) and out["gemm_err"] < 5e-3
    assert out["layer_of_bound"] == pytest.approx(max(read_us, gemm_us) / 60.0)
    assert list(bounds_table([out]).columns) == BOUND_COLUMNS


def test_a_dense_product_off_float32_is_not_timed(monkeypatch):
    monkeypatch.setattr(bm, "dense_gemms", lambda *a, **k: (lambda: None, 0.5))
    out = bm.measure_point(row(), CEIL, DEVICE, counting_timer(1.0, 1.0), sms=1)
    assert "off float32: not timed" in out["error"] and out.get("bound_us") is None
    assert summarize([out])["not_measured"] == ["tiny bf16 M=1"]


def test_run_rows_keep_every_column_and_load_back(tmp_path):
    """A bounds run folder's rows are the points' rows, floored under this run's ceilings, bounds added."""
    point = {**row(M=4, time_us=80.0, floor_us=1.0, pct_of_floor=1.25), "run": "runs/a"}
    out = bm.measure_point(point, CEIL, DEVICE, counting_timer(30.0, 10.0), sms=1)
    point.update(bytes=float(point["bytes"]), reps=200.0)  # as a column with a missing value reads back
    failed = {**out, "error": "OutOfMemoryError: CUDA out of memory"}
    writer = RunWriter(tmp_path / "bounds", {"ceilings": CEIL.as_dict()})
    for r in (out, failed):
        writer.append(bm.run_row(point, r, CEIL))
    writer.finish(summary=summarize([out]))
    meta, df = load_run(tmp_path / "bounds")
    fl = floor(problem_of(point), point["experts_touched"], CEIL)
    first = df.iloc[0]
    assert first["floor_us"] == pytest.approx(fl.floor_us) and first["time_us"] == 80.0
    assert first["pct_of_floor"] == pytest.approx(100 * fl.floor_us / 80.0)
    assert first["bound_us"] == 30.0 and first["source_run"] == "runs/a" and pd.isna(first["error"])
    assert df.iloc[1]["error"] == "bounds: OutOfMemoryError: CUDA out of memory"
    assert meta["summary"]["points"] == 1
    written = json.loads((tmp_path / "bounds" / "rows.jsonl").read_text().splitlines()[0])
    assert isinstance(written["bytes"], int) and written["reps"] == 200 and isinstance(written["reps"], int)


def test_an_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match="a file is in the way"):
        bm.open_writer(tmp_path / "f", {})


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_out_in_a_read_only_folder_is_one_line(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(UserError, match="--out .*runs"):
            bm.open_writer(tmp_path / "runs", {})
    finally:
        tmp_path.chmod(0o700)


def test_preflight_on_a_gpu_checks_out_without_creating_it(tmp_path, monkeypatch):
    """preflight passes on a (stand-in) GPU machine and leaves a fresh --out uncreated: the folder comes with
    the run folder, after the ceilings are measured; a file in the way is refused there."""
    from types import SimpleNamespace

    from moebench.paths.base import Target

    gpu = SimpleNamespace(device=torch.device("cuda"), interpreter=False)
    monkeypatch.setattr(Target, "current", staticmethod(lambda: gpu))
    monkeypatch.setattr("moebench.environment.device_name", lambda: GPU)
    points = pd.DataFrame([{**row(), "run": "runs/a"}])
    fresh = tmp_path / "fresh" / "out"
    bm.preflight(points, fresh)
    assert not (tmp_path / "fresh").exists()
    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match="a file is in the way"):
        bm.preflight(points, tmp_path / "f" / "out")


@pytest.mark.skipif(torch.cuda.is_available(), reason="describes a machine without a GPU")
def test_run_bounds_refuses_a_machine_without_a_gpu():
    with pytest.raises(UserError, match="on a CUDA GPU; this machine has none"):
        bm.run_bounds(pd.DataFrame([{**row(), "run": "runs/a"}]))


# ---- on a GPU: the measuring code with its own timer -----------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="graph-replay timing needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["bf16", "fp8-tensor"])
def test_measure_point_on_the_gpu(dtype):
    shape = MoEShape("small", experts=8, hidden=1024, intermediate=512, topk=2)
    point = {**row(M=16, dtype=dtype, time_us=1000.0, shape=shape), "run": "runs/a"}
    out = bm.measure_point(point, CEIL, "cuda", bm.graph_timer(0.02), sms=torch.cuda.get_device_properties(
        0).multi_processor_count)
    assert out["error"] is None, out["error"]
    assert 0 < out["read_us"] < 1000 and 0 < out["gemm_us"] < 1000 and out["gemm_err"] < bm.GEMM_RTOL


# ---- the command line --------------------------------------------------------------------------------

def moebench(*args: str) -> subprocess.CompletedProcess:
    return moebench_in_process(*args, cwd=ROOT)


@pytest.mark.skipif(torch.cuda.is_available(), reason="describes a machine without a GPU")
def test_cli_refusals_are_one_line_exit_2(tmp_path):
    """An interpreter run, a path with no rows, and (its run being fine) this GPU-less machine."""
    gpu_run = write_run(tmp_path / "gpu", [row()])
    cpu_run = write_run(tmp_path / "cpu", [row(interpreter=True)], interpreter=True)
    for args, fragment in (
        ([str(cpu_run)], "interpreter (CPU) run"),
        ([str(gpu_run), "--path", "cutlass"], "no correct, timed rows of path 'cutlass'"),
        ([str(gpu_run), "--format", "json"], "this machine has none"),
    ):
        proc = moebench("bounds", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert fragment in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""
    fresh = tmp_path / "fresh" / "out"
    proc = moebench("bounds", str(gpu_run), "--out", str(fresh))
    assert proc.returncode == 2 and "this machine has none" in proc.stderr
    assert not (tmp_path / "fresh").exists()  # refused: neither --out nor a folder above it
