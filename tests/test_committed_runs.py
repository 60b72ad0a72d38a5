"""The project's committed runs load as they are: every run folder under results/ (a folder with meta.json)
through the loader every report uses, ``report --format csv`` on each kind of folder, and a one-line refusal
for the folders that hold a probe's JSON Lines or folders of run folders."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import moebench_in_process

from moebench.report import runs
from moebench.store.runfolder import META_FILE

RESULTS = Path(__file__).resolve().parent.parent / "results"
RUN_FOLDERS = sorted(p.parent for p in RESULTS.rglob(META_FILE))


def test_results_holds_the_kinds_of_run_folder_this_module_checks():
    """The walk below finds runs of each kind: sweeps, tunes, traces, a bounds run and gzipped rows."""
    metas = {p.relative_to(RESULTS).as_posix() for p in RUN_FOLDERS}
    assert len(metas) >= 25
    assert {"h200-tune-classic-54407e6", "h200-bounds-9476d0f", "h200-trace-03dae1f/cold"} <= metas
    assert any((p / "rows.jsonl.gz").is_file() for p in RUN_FOLDERS)


@pytest.mark.parametrize("folder", RUN_FOLDERS, ids=lambda p: p.relative_to(RESULTS).as_posix())
def test_every_committed_run_folder_loads_through_the_report_loader(folder):
    loaded = runs.load([folder])
    (run,) = loaded.runs
    assert run.path == folder and not run.empty


@pytest.mark.parametrize("folder, table", [
    ("h200-quick-9476d0f", "throughput"),  # a sweep, rows gzipped
    ("baselines/h200-quick-d62257d", "throughput"),  # a folder of run folders
    ("h200-bounds-9476d0f", "throughput"),  # rows with columns of their own beside Row's
    ("h200-tables-a103922/qwen3-30b-a3b-bf16", "tuned"),  # a tune with failed candidates
    ("h200-tune-classic-54407e6", "tuned"),
    ("h200-trace-03dae1f/cold", "cold_start"),  # a trace: requests, not benchmark rows
    ("h100-step-ffc1094/spec/20261208-000240-step-qwen3-30b-a3b-bf16", "ttft"),  # a step: parts, composed
])
def test_report_csv_reads_each_kind_of_committed_folder(folder, table):
    done = moebench_in_process("report", str(RESULTS / folder), "--format", "csv", "--table", table)
    assert done.returncode == 0, done.stderr
    header, *lines = done.stdout.splitlines()
    assert header.startswith("model,dtype,") and lines
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("folder, fragment", [
    ("h200-ab-pdl-072bd27", "holds JSON Lines (ab-pdl-all.jsonl, ab-pdl-prefetch.jsonl) but no meta.json"),
    ("h200-gemm-split-fcd928f", "holds JSON Lines (rows.jsonl) but no meta.json"),  # rows.jsonl, yet a probe's
    ("h200-move-ab-54407e6", "holds folders of run folders, not runs: name them one by one"),
    ("h200-isa-04af067", "is not a moebench run folder"),
])
@pytest.mark.parametrize("command", [("report",), ("plot", "--out", "plots"), ("export-configs",)])
def test_committed_folders_that_are_no_run_are_refused_in_one_line(tmp_path, folder, fragment, command):
    path = str(RESULTS / folder)
    args = [command[0], path, *command[1:]]
    done = moebench_in_process(*args, cwd=tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    if command[0] != "export-configs":  # export-configs reads one run folder: its own refusal
        assert line.startswith(f"error: {path} {fragment}")
    else:
        assert line.startswith(f"error: {path} ")
    assert not (tmp_path / "plots").exists()
