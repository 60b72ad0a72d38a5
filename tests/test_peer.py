"""``report --peer``: a run's points against another kernel's times on the same points, matched on (model,
dtype, M), each point's fastest ok row of the triton path, speedup = peer / run; bad peer files in one line."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from helpers import moebench_in_process

from moebench.report import peer
from moebench.report.runs import load

RUN = Path(__file__).resolve().parent.parent / "results" / "h200-kernels-0dcfbb8"  # a tuned sweep: many rows a point


@cache
def rows():
    return load([RUN]).rows


def fastest(model: str, dtype: str, M: int) -> float:
    df = rows()
    at = df[(df["model"] == model) & (df["dtype"] == dtype) & (df["M"] == M) & (df["path"] == "triton")
            & (df["status"] == "ok")]
    return float(at["time_us"].min())


def peer_file(tmp_path: Path, field: str = "time_us") -> Path:
    """A header line, three of the run's points at twice and half its time, and a point the run lacks."""
    lines = [{"about": "a header of provenance, skipped"},
             {"model": "mixtral-8x7b", "dtype": "bf16", "M": 1, field: 2 * fastest("mixtral-8x7b", "bf16", 1)},
             {"model": "qwen3-30b-a3b", "dtype": "bf16", "M": 4, field: 2 * fastest("qwen3-30b-a3b", "bf16", 4)},
             {"model": "qwen3-30b-a3b", "dtype": "fp8-block128", "M": 16,
              field: 0.5 * fastest("qwen3-30b-a3b", "fp8-block128", 16)},
             {"model": "no-such-model", "dtype": "bf16", "M": 1, field: 1.0}]
    path = tmp_path / "peer.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_each_point_both_have_is_its_fastest_row_against_the_peer(tmp_path):
    table = peer.peer_table(rows(), peer.read_peer(peer_file(tmp_path)))
    assert list(zip(table["model"], table["M"])) == [("mixtral-8x7b", 1), ("qwen3-30b-a3b", 4), ("qwen3-30b-a3b", 16)]
    assert table["speedup"].round(6).tolist() == [2.0, 2.0, 0.5]
    line = peer.summary(table, 4)
    assert line.startswith("3 of the peer's 4 points: geometric mean 1.260x, 1 behind; lowest 0.500x")


def test_the_command_reads_the_field_it_is_told(tmp_path):
    done = moebench_in_process("report", str(RUN), "--peer", str(peer_file(tmp_path, "vllm_gemms_us")),
                               "--peer-field", "vllm_gemms_us", "--format", "csv")
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header == "model,dtype,M,time_us,peer_us,speedup" and len(rows) == 3


@pytest.mark.parametrize("content, says", [
    (None, "cannot be read"),
    ("{not json\n", "not a JSON line"),
    ('{"model": "mixtral-8x7b", "dtype": "bf16", "M": 1}\n', "no line with model, dtype, M and a positive"),
])
def test_a_bad_peer_file_is_one_line_and_exit_2(tmp_path, content, says):
    path = tmp_path / "peer.jsonl"
    if content is not None:
        path.write_text(content)
    done = moebench_in_process("report", str(RUN), "--peer", str(path))
    assert done.returncode == 2 and says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
