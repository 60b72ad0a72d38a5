"""The command line end to end: outputs, run folders, and bad input, on the CPU (Triton interpreter) and on a GPU
machine alike. The sweep most tests read is an interpreter run wherever the tests run (on a GPU machine a fresh
process makes it with the GPU hidden); the tests of what a sweep does differently without a GPU skip on one."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import moebench_in_process

from moebench._interpret import interpreting
from moebench.store.runfolder import ROW_COLUMNS, load_run

ROOT = Path(__file__).resolve().parent.parent
GPU_RUN = ROOT / "tests" / "data" / "h200-quick"  # a run folder from an H200 (the quick spec)

# What a sweep does in this process only where Triton runs on the interpreter (the defaults it swaps, the
# refusals of GPU-only work); on a GPU machine the same command runs on the GPU.
interpreter_only = pytest.mark.skipif(not interpreting(), reason="checks what a sweep does without a GPU")


def moebench(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The command through its entry point, in this process (``helpers.moebench_in_process``)."""
    return moebench_in_process(*args, cwd=cwd or ROOT)


def moebench_process(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """The command in a fresh interpreter, for what only a new process shows; ``env`` is added to its environment."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "moebench", *args], capture_output=True, text=True, env=env,
                          cwd=cwd or ROOT, timeout=600)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One small sweep shared by the tests below: tiny shape, two M, fp32, triton and the reference, on the
    interpreter. Where this process runs Triton on a GPU, a fresh process runs it with no GPU visible and the
    interpreter on (Triton reads TRITON_INTERPRET once, when it is imported)."""
    out = tmp_path_factory.mktemp("runs")
    args = ("sweep", "--model", "tiny", "--m", "1,5", "--dtype", "fp32", "--path", "triton,torch",
            "--out", str(out), "--format", "csv", "--no-progress")
    proc = moebench(*args) if interpreting() else moebench_process(*args, CUDA_VISIBLE_DEVICES="",
                                                                   TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = list(out.iterdir())
    return proc, run_dir


def test_sweep_writes_a_complete_run_folder(cpu_run):
    """meta.json says what ran where; rows.jsonl has one checked row per point with every column."""
    _, run_dir = cpu_run
    meta, df = load_run(run_dir)
    assert meta["status"] == "complete" and meta["interpreter"] is True
    for key in ("torch", "triton", "moebench", "command", "timing_method", "schema_version", "device_name"):
        assert meta.get(key) is not None, key
    assert len(df) == 2 * 2
    assert set(ROW_COLUMNS) <= set(df.columns)
    assert (df["status"] == "ok").all() and df["correct"].all()
    assert (df.loc[df["path"] == "triton", "rel_err"] < 2e-3).all()
    assert df["time_us"].notna().all() and df["interpreter"].all()
    assert df.loc[df["path"] == "triton", "config"].map(lambda c: "BLOCK_SIZE_M" in c).all()


def test_sweep_prints_csv_tables_and_says_cpu_is_not_gpu(cpu_run):
    proc, _ = cpu_run
    assert proc.stdout.splitlines()[0].startswith("model,dtype,M,path,time_us")
    assert "not GPU performance" in proc.stderr


def test_report_json_matches_rows(cpu_run):
    """`moebench report --format json` re-reads the folder: one throughput record per ok row."""
    _, run_dir = cpu_run
    proc = moebench("report", str(run_dir), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert len(data["throughput"]) == 4 and {"decode_tok_s", "pct_of_floor"} <= set(data["throughput"][0])


def test_report_takes_several_run_folders_together(cpu_run, tmp_path):
    """Rows of every folder named are reported together (a benchmark split over several runs)."""
    _, run_dir = cpu_run
    other = tmp_path / "other-run"  # the same run with other token counts: four more points
    shutil.copytree(run_dir, other)
    rows = [json.loads(line) for line in (other / "rows.jsonl").read_text().splitlines()]
    (other / "rows.jsonl").write_text("".join(json.dumps({**r, "M": r["M"] + 1000}) + "\n" for r in rows))
    proc = moebench("report", str(run_dir), str(other), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    ms = [r["M"] for r in json.loads(proc.stdout)["throughput"]]
    assert len(ms) == 2 * 4 and sum(m > 1000 for m in ms) == 4


def test_report_gains_over_runs_of_two_commits_names_each_points(cpu_run, tmp_path):
    """`report --gains` over folders of different commits says which commit each point's best row is from:
    here the second folder's rows are twice as fast at M=5 and half as fast at M=1."""
    _, run_dir = cpu_run
    for name, commit, speedup in (("a", "aaaaaaa", {1: 1, 5: 1}), ("b", "bbbbbbb", {1: 0.5, 5: 2})):
        folder = tmp_path / name
        shutil.copytree(run_dir, folder)
        meta = json.loads((folder / "meta.json").read_text())
        (folder / "meta.json").write_text(json.dumps({**meta, "git_commit": commit, "interpreter": False}))
        rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
        (folder / "rows.jsonl").write_text("".join(  # made GPU rows: --gains refuses interpreter timings
            json.dumps({**r, "time_us": r["time_us"] / speedup[r["M"]], "interpreter": False}) + "\n"
            for r in rows))
    proc = moebench("report", str(tmp_path / "a"), str(tmp_path / "b"), "--gains", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert {r["M"]: r["commit"] for r in json.loads(proc.stdout)} == {1: "aaaaaaa", 5: "bbbbbbb"}


def test_compare_of_interpreter_runs_is_correctness_only(cpu_run):
    """Interpreter runs get CORRECT / BROKEN verdicts, no speed: no ratio, no FASTER or SLOWER."""
    _, run_dir = cpu_run
    proc = moebench("compare", str(run_dir), str(run_dir), "--format", "csv", "--fail-on-slower")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(io.StringIO(proc.stdout))
    assert len(table) == 4 and set(table["verdict"]) == {"CORRECT"}
    assert "ratio" not in table.columns and "new_us" not in table.columns


def test_report_gains_of_an_interpreter_run_is_refused(cpu_run):
    _, run_dir = cpu_run
    proc = moebench("report", str(run_dir), "--gains")
    assert proc.returncode == 2
    (line,) = _error_lines(proc.stderr)
    assert "interpreter" in line and "nan" not in proc.stdout + proc.stderr


def test_csv_output_is_one_loadable_table(cpu_run):
    """--format csv prints one table (throughput by default, --table ttft for the other), nothing else."""
    proc, run_dir = cpu_run
    for stdout in (proc.stdout, moebench("report", str(run_dir), "--format", "csv").stdout):  # sweep, report
        table = pd.read_csv(io.StringIO(stdout))
        assert list(table.columns[:4]) == ["model", "dtype", "M", "path"] and len(table) == 4
    proc = moebench("report", str(run_dir), "--format", "csv", "--table", "ttft")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "model,dtype,path,prompt_len,moe_ttft_ms"  # interpreter rows: no TTFT


def test_export_configs_refuses_interpreter_runs(cpu_run, tmp_path):
    """CPU timings must not pick GPU tile configs."""
    _, run_dir = cpu_run
    proc = moebench("export-configs", str(run_dir), "--out", str(tmp_path / "cfg"))
    assert proc.returncode == 2 and "interpreter" in proc.stderr
    assert not (tmp_path / "cfg").exists()


@pytest.mark.parametrize("args, fragment", [
    (["sweep", "--model", "nosuch", "--m", "1"], "unknown model"),  # unknown preset
    (["sweep", "--model", "tiny", "--m", "0"], "M must be a token count"),  # impossible M
    (["sweep", "--model", "tiny", "--m", "1", "--topk", "9"], "impossible"),  # top-k > experts
    pytest.param(["sweep", "--model", "tiny", "--m", "1", "--path", "cutlass"], "sm90",
                 marks=interpreter_only),  # GPU-only path on a CPU
    (["sweep", "--experts", "8", "--hidden", "64", "--m", "1"], "needs --experts"),  # incomplete shape
    (["sweep", "missing.yaml"], "no sweep spec"),  # missing file
    (["sweep", "--hf-config", "nowhere/config.json", "--m", "1"], "nowhere"),  # missing HF config
    (["sweep", "--model", "tiny", "--m", "1", "--dtype", "int3"], "unknown dtype"),  # unknown dtype
    (["report", "no-such-run"], "no run folder"),  # missing run folder
    (["sweep", "--model", "tiny", "--m", ""], "--m is empty"),  # an empty list is no default
    (["sweep", "--model", "tiny", "--m", "1", "--tp", "x"], "'x' is not a valid integer"),  # click's own check
    (["sweep", "--model", "tiny", "--m", "1", "--bogus"], "No such option"),  # an unknown flag
    (["sweep", "nosuch-spec"], "shipped specs: cpu"),  # neither a file nor a shipped spec's name
    (["profile", "--config", '{"BLOCK_SIZE_M": 16}'], "--config"),  # a tile config missing fields
    (["profile", "--config", "[16, 64]"], "JSON object"),  # a tile config that is not an object
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, fragment):
    out = tmp_path / "out"
    proc = moebench(*args, *(["--out", str(out)] if args[0] == "sweep" else []), cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "Triton interpreter" not in line
             and "not GPU performance" not in line]
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.iterdir())


def test_bad_yaml_spec(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("models: [tiny]\nm: [1]\nwarmup: 3\n")
    proc = moebench("sweep", str(spec), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "unknown key 'warmup'" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_export_configs_from_the_committed_h200_run(tmp_path):
    """The committed H200 sweep timed moebench's kernel (path triton) only: the engine layouts refuse it and say
    how to get their rows; --layout moebench writes one loadable table per (E, N, dtype) and the sidecar."""
    from moebench.tables.formats.moebench import load_table

    proc = moebench("export-configs", str(GPU_RUN), "--out", str(tmp_path / "vllm"))
    assert proc.returncode == 2 and "moebench tune --path triton-classic" in proc.stderr
    assert not (tmp_path / "vllm").exists()
    proc = moebench("export-configs", str(GPU_RUN), "--out", str(tmp_path), "--layout", "moebench")
    assert proc.returncode == 0, proc.stderr
    *tables, sidecar = [Path(p) for p in proc.stdout.splitlines()]
    assert sidecar == tmp_path / "moebench-export.json"
    assert {p.name for p in tables} == {"moebench-tiles_E=8,N=14336,device_name=NVIDIA_H200,dtype=bf16.json",
                                        "moebench-tiles_E=256,N=2048,device_name=NVIDIA_H200,dtype=bf16.json"}
    for p in tables:
        meta, table = load_table(p)
        assert sorted(table) == [1, 16, 128, 1024, 4096] and meta.triton_version == "3.6.0"


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@interpreter_only
def test_sweep_with_its_defaults_runs_on_the_cpu_and_says_what_it_changed(tmp_path):
    """`moebench sweep --model tiny`: the GPU defaults (bf16, cutlass, M up to 4096) give way to what the
    interpreter runs (fp16, torch, small M), one stderr line says so, and the table shows each point's check."""
    proc = moebench("sweep", "--model", "tiny", "--out", str(tmp_path), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    (changed,) = [line for line in proc.stderr.splitlines() if line.startswith("No CUDA GPU, so:")]
    assert all(word in changed for word in ("fp16 in place of bf16", "torch in place of cutlass", "M 1,16,64"))
    (run_dir,) = list(tmp_path.iterdir())
    _, df = load_run(run_dir)
    assert set(df["dtype"]) == {"fp16"} and set(df["path"]) == {"triton", "torch"}
    assert sorted(set(df["M"])) == [1, 16, 64] and df["correct"].all()
    header = next(line for line in proc.stdout.splitlines() if "model" in line)
    assert "correct" in header and "rel_err" in header and "tflops" not in header
    assert "time-to-first-token" not in proc.stdout  # no TTFT from an interpreter run or a 1-token layer


@interpreter_only
def test_bf16_asked_for_by_name_is_refused_on_the_cpu(tmp_path):
    """What the user names is not swapped: the interpreter's reason is the one error line."""
    proc = moebench("sweep", "--model", "tiny", "--m", "1", "--dtype", "bf16", "--path", "triton",
                    "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    (line,) = _error_lines(proc.stderr)
    assert line.startswith("error: path 'triton'") and "bf16 tl.dot wrongly" in line
    assert not (tmp_path / "out").exists()


def test_run_files_get_the_permissions_of_any_new_file(cpu_run):
    """meta.json is renamed from a temp file: it reads like rows.jsonl (0666 less the umask), not 0600."""
    _, run_dir = cpu_run
    umask = os.umask(0)
    os.umask(umask)
    for name in ("meta.json", "rows.jsonl"):
        assert (run_dir / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_compare_a_cpu_run_with_a_gpu_run_is_one_error(cpu_run):
    """Interpreter timings against an H200's: one line that says why, exit 2, and no warning before it."""
    _, run_dir = cpu_run
    for base, new in ((run_dir, GPU_RUN), (GPU_RUN, run_dir)):
        proc = moebench("compare", str(base), str(new))
        assert proc.returncode == 2
        (line,) = _error_lines(proc.stderr)
        assert line.startswith("error: cannot compare") and "interpreter" in line and "NVIDIA H200" in line


def test_report_leaves_out_a_torn_last_row_and_says_so(cpu_run, tmp_path):
    """A run killed while appending leaves half a line: the rows before it are reported, with a warning."""
    _, run_dir = cpu_run
    torn = tmp_path / "torn"
    shutil.copytree(run_dir, torn)
    with open(torn / "rows.jsonl", "a") as f:
        f.write('{"model": "ti')
    proc = moebench("report", str(torn), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["throughput"]) == 4
    (line,) = _error_lines(proc.stderr)
    assert "line 5 is cut short" in line


def test_report_of_a_folder_of_runs_reports_the_runs_inside(cpu_run, tmp_path):
    """A folder of run folders (a baseline) counts as its runs; a folder with none is one error line."""
    _, run_dir = cpu_run
    shutil.copytree(run_dir, tmp_path / "many" / "one-run")
    shutil.copytree(run_dir, tmp_path / "many" / "two-run")
    proc = moebench("report", str(tmp_path / "many"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["throughput"]) == 4  # the same points twice: one row each
    (tmp_path / "empty").mkdir()
    proc = moebench("report", str(tmp_path / "empty"))
    assert proc.returncode == 2
    (line,) = _error_lines(proc.stderr)
    assert "not a moebench run folder" in line


@pytest.mark.parametrize("args", [
    ["sweep", "--model", "tiny", "--m", "1", "--path", "torch", "--out", "{file}"],  # --out is a file
    ["sweep", "--model", "tiny", "--m", "1", "--path", "torch", "--out", "{file}/runs"],  # a file in its path
    ["export-configs", str(GPU_RUN), "--out", "{file}"],  # the tables' folder is a file
])
def test_an_output_path_that_is_a_file_is_one_line(tmp_path, args):
    file = tmp_path / "taken"
    file.write_text("keep me\n")
    proc = moebench(*(a.format(file=file) for a in args))
    assert proc.returncode == 2, proc.stderr
    (line,) = _error_lines(proc.stderr)
    assert line.startswith("error:") and str(file) in line and "Traceback" not in proc.stderr
    assert file.read_text() == "keep me\n" and sorted(tmp_path.iterdir()) == [file]


def test_an_output_folder_that_is_read_only_is_one_line(tmp_path):
    """--out in a folder that takes no new files; skipped where the user (root) can write there anyway."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user can write into a 0555 folder (root)")
        for out in (locked, locked / "runs"):
            proc = moebench("sweep", "--model", "tiny", "--m", "1", "--path", "torch", "--out", str(out))
            assert proc.returncode == 2, proc.stderr
            (line,) = _error_lines(proc.stderr)
            assert line.startswith("error:") and str(locked) in line
        assert not any(locked.iterdir())
    finally:
        locked.chmod(0o755)


def test_an_output_folder_on_a_read_only_mount_is_one_line(tmp_path, monkeypatch, capsys):
    """A read-only file system (EROFS, simulated: creating any folder fails) ends in one line and exit 2."""
    import errno

    from moebench.cli import main as cli

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    out = tmp_path / "mnt" / "runs"
    monkeypatch.setattr(sys, "argv", ["moebench", "sweep", "--model", "tiny", "--m", "1", "--path", "torch",
                                      "--out", str(out), "--no-progress"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert line == f"error: {out}: {os.strerror(errno.EROFS)}"
    assert not (tmp_path / "mnt").exists()


def test_plot_and_html_report_of_a_committed_h200_run(tmp_path):
    """`plot` writes a PNG per chart the run supports and prints their paths; `report --html` writes one page."""
    run = GPU_RUN
    proc = moebench("plot", str(run), "--out", str(tmp_path / "plots"))
    assert proc.returncode == 0, proc.stderr
    paths = [Path(p) for p in proc.stdout.split()]
    assert {p.name for p in paths} == {"time.png", "floor.png", "gains.png", "ttft.png"}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
    proc = moebench("report", str(run), "--html", str(tmp_path / "page.html"), "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "page.html").read_text().count("data:image/png;base64,") == len(paths)
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["page.html"]


def test_gate_exit_status_on_the_committed_baseline(tmp_path):
    """`compare BASELINE CURRENT --fail-slower 5`: 0 for a repeat run of the same code, 1 naming the point
    for a copy with one point 10% slower, 2 for a run of another sweep. It reads the committed gate baseline and
    repeat runs in results/ (not copies): the check is that `make gate`'s own evidence passes through the CLI."""
    baseline = ROOT / "results" / "baselines" / "h200-quick-d62257d"
    repeat = sorted(p for p in (ROOT / "results" / "h200-quick-repeat-d62257d").iterdir() if p.is_dir())[0]
    proc = moebench("compare", str(baseline), str(repeat), "--fail-slower", "5", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    slowed = tmp_path / "slowed"
    shutil.copytree(repeat, slowed)
    packed = slowed / "rows.jsonl.gz"  # the committed rows are gzipped; the slowed copy is written plain
    rows = [json.loads(line) for line in gzip.decompress(packed.read_bytes()).decode().splitlines()]
    packed.unlink()
    for r in rows:
        if r["model"] == "deepseek-v3" and r["M"] == 16 and r["path"] == "triton":
            r.update({k: r[k] * 1.1 for k in ("time_us", "time_p20_us", "time_p80_us")})
    (slowed / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = moebench("compare", str(baseline), str(slowed), "--fail-slower", "5", "--format", "csv")
    assert proc.returncode == 1
    assert [line for line in proc.stderr.splitlines() if line.startswith("regression")] == [
        line for line in proc.stderr.splitlines() if "deepseek-v3 bf16 M=16 triton" in line]
    proc = moebench("compare", str(baseline), str(ROOT / "tests" / "data" / "h200-kernels"), "--fail-slower", "5")
    assert proc.returncode == 2
    (line,) = _error_lines(proc.stderr)
    assert "lacks" in line


@pytest.mark.parametrize("command", ["sweep", "tune", "warmup", "trace"])
def test_dtype_help_names_every_dtype_of_the_table(command):
    """`--help` lists the dtypes read from `moebench.dtypes.DTYPES`, `fp8-tensor-static` included."""
    from moebench.dtypes import DTYPES

    proc = moebench(command, "--help")
    assert proc.returncode == 0, proc.stderr
    flat = re.sub(r"-\s+", "-", " ".join(proc.stdout.split()))  # click may wrap after a hyphen
    assert all(name in flat for name in DTYPES), flat


def test_trace_csv_error_shows_the_cell_as_a_plain_number(tmp_path):
    """A negative token count in `trace --csv` is named as the file holds it (-3), not as numpy's np.int64(-3)."""
    (tmp_path / "lens.csv").write_text("prompt_len\n4\n-3\n")
    proc = moebench("trace", "--model", "tiny", "--csv", "lens.csv", "--out", "out", "--no-progress", cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = _error_lines(proc.stderr)
    assert "line 3 holds -3" in line and "np." not in line
