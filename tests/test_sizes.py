"""Sizes that cannot fit: ``Problem.bytes_needed`` counts a point's bytes, ``check_fits`` refuses one that exceeds
the device's memory, and every command that builds problems (sweep, tune, warmup, trace) refuses it up front:
exit 2, one line naming the point, nothing created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import moebench_in_process

from moebench.errors import UserError
from moebench.models import MoEShape, get_model
from moebench.problem import Problem, check_fits, memory_bytes

SHAPE = MoEShape("s", 4, 64, 32, 2)  # experts=4, hidden=64, intermediate=32, topk=2


def test_bytes_needed_counts_weights_inputs_output_and_reference():
    """fp16, by hand: weights 4*3*32*64*2, x and output 8*64*2 each, top-k weights and ids 8*2*4 each; the
    reference adds float32 x and output (8*64*4 each) and one expert's float32 weights (3*32*64*4)."""
    p = Problem(SHAPE, 8, "fp16")
    plain = 4 * 3 * 32 * 64 * 2 + 2 * 8 * 64 * 2 + 8 * 2 * 8
    assert p.bytes_needed(reference=False) == plain
    assert p.bytes_needed() == plain + 2 * 8 * 64 * 4 + 3 * 32 * 64 * 4


def test_bytes_needed_counts_fp8_weights_as_built():
    """fp8 weights are drawn in their activation dtype (bf16) before they are quantized: 2 bytes each, not 1."""
    fp8, bf16 = Problem(SHAPE, 1, "fp8-channel"), Problem(SHAPE, 1, "bf16")
    assert fp8.bytes_needed() == bf16.bytes_needed()


def test_check_fits_names_the_first_point_that_does_not_fit(monkeypatch):
    """Against a device of 1 MiB, M=1 fits and M=10**6 does not: the one line names that point."""
    monkeypatch.setattr("moebench.problem.memory_bytes", lambda device: 2**20)
    small, big = Problem(SHAPE, 1, "fp16"), Problem(SHAPE, 10**6, "fp16")
    assert small.bytes_needed() < 2**20 < big.bytes_needed()
    check_fits([small], "cpu")
    with pytest.raises(UserError, match=r"^s fp16 M=1000000 .* needs .* GiB .* more than the 0\.0 GiB") as e:
        check_fits([small, big], "cpu")
    assert "\n" not in str(e.value)


def test_memory_of_the_cpu_is_the_machines_ram():
    assert memory_bytes("cpu") > 2**20


def _refused(result, tmp_path: Path, point: str) -> None:
    """Exit 2, one line on stderr naming ``point``, no traceback, and no run folder under tmp_path."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and point in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    made = [p for p in tmp_path.rglob("*") if p.name in ("meta.json", "rows.jsonl")]
    assert made == []


def test_sweep_refuses_a_token_count_that_cannot_fit(tmp_path):
    """M=10**9 of tiny: weights of kilobytes, but 10**9 rows of activations; refused by the bound on M
    (``problem.M_MAX``) before the run folder."""
    r = moebench_in_process("sweep", "--model", "tiny", "--m", "1000000000", "--no-progress", "--out",
                            str(tmp_path / "results"), cwd=tmp_path)
    _refused(r, tmp_path, "M must be a token count from 1 to 1048576, got 1000000000")
    assert not (tmp_path / "results").exists()


def test_tune_refuses_an_expert_count_that_cannot_fit(tmp_path):
    """4096 experts of 65536 x 65536, each size within its bound (``models.MAX_SIZES``): hundreds of terabytes of
    weights; refused before the tune's run folder (it used to spin at full CPU for minutes)."""
    r = moebench_in_process("tune", "--experts", "4096", "--hidden", "65536", "--intermediate", "65536",
                            "--topk", "2", "--dtype", "fp16", "--m", "1", "--no-progress", "--out",
                            str(tmp_path / "results"), cwd=tmp_path)
    _refused(r, tmp_path, "custom-e4096-h65536-i65536 fp16 M=1")


def test_tune_refuses_a_huge_hf_config(tmp_path):
    """A config.json whose shape cannot fit is refused, not tuned into "every config failed" and exit 0."""
    cfg = {"hidden_size": 65536, "intermediate_size": 65536, "num_local_experts": 4096, "num_experts_per_tok": 2,
           "num_hidden_layers": 1}
    (tmp_path / "huge").mkdir()
    (tmp_path / "huge" / "config.json").write_text(json.dumps(cfg))
    r = moebench_in_process("tune", "--hf-config", str(tmp_path / "huge"), "--dtype", "fp16", "--m", "1",
                            "--no-progress", "--out", str(tmp_path / "results"), cwd=tmp_path)
    _refused(r, tmp_path, "M=1")


def test_warmup_refuses_max_tokens_that_cannot_fit(tmp_path):
    """--max-tokens 10**9 is refused (the bound on M) before a plan of 10**9 entries is built."""
    r = moebench_in_process("warmup", "--model", "tiny", "--dtype", "fp16", "--max-tokens", "1000000000",
                            "--jobs", "0", "--no-progress", "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    _refused(r, tmp_path, "M must be a token count from 1 to 1048576, got 1000000000")
    assert not (tmp_path / "cache").exists()


def test_trace_refuses_a_request_that_cannot_fit(tmp_path):
    """A CSV prompt of 10**9 tokens (--max-tokens as large) is refused (the bound on M) before the trace's run
    folder."""
    (tmp_path / "prompts.csv").write_text("prompt_len\n1000000000\n")
    r = moebench_in_process("trace", "--model", "tiny", "--dtype", "fp16", "--csv", str(tmp_path / "prompts.csv"),
                            "--max-tokens", "1000000000", "--no-progress", "--in-process", "--out",
                            str(tmp_path / "results"), cwd=tmp_path)
    _refused(r, tmp_path, "M must be a token count from 1 to 1048576, got 1000000000")
    assert not (tmp_path / "results").exists()


def test_a_preset_at_its_usual_sizes_fits_a_gpu():
    """The check refuses only what cannot fit: Mixtral bf16 at M=4096 needs less than an H200's 141 GB."""
    assert Problem(get_model("mixtral"), 4096, "bf16").bytes_needed() < 141 * 10**9
