"""The command line as a shell user meets it: bare ``moebench`` prints its help, a reader that stops early (``|
head``) ends the command with the shell's 141 rather than an error, progress and notes on a pipe are not cut at
80 columns, and the same thing has one flag name across commands (older names still taken)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "results" / "h200-quick-17c3303"  # a committed GPU run: report prints its tables


def _moebench(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "moebench", *args], env=env, cwd=ROOT, timeout=120, **kw)


def test_bare_moebench_prints_its_help_and_exits_0():
    proc = _moebench(capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("Usage:") and "Commands:" in proc.stdout
    assert "error" not in proc.stderr


@pytest.mark.parametrize("args", [
    ("report", str(QUICK), "--table", "throughput"),  # a rich table
    ("report", str(QUICK), "--format", "csv"),  # text for programs (click.echo)
    ("models",),  # plain lines
], ids=lambda a: " ".join(a[:1] + a[-1:]))
def test_a_reader_that_has_gone_ends_the_command_with_141(args):
    """stdout is a pipe whose reader is gone before the command writes (``| head`` that has read its lines):
    exit 141, as a shell's own tools, with nothing on stderr."""
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "moebench", *args], stdout=w, stderr=subprocess.PIPE, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(r)  # the reader goes first: every write of the command meets a broken pipe
    os.close(w)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""


def test_notes_and_progress_on_a_pipe_are_not_cut_at_80_columns():
    from moebench.cli.console import err_console

    assert not sys.stderr.isatty()  # pytest captures stderr: it is no terminal here
    assert err_console().width >= 200


@pytest.mark.parametrize("command, new, old", [
    ("warmup", "--compile-jobs", "--jobs"),  # as tune, tune-tables, retime and fit-time name it
    ("fit-check", "--device-name", "--device"),  # as doctor names it
    ("tune-tables", "--configs", "--into"),  # as sweep, trace, warmup and fit-check name the tables' folder
])
def test_one_flag_name_for_one_thing_and_the_older_name_still_taken(command, new, old):
    from click.testing import CliRunner

    from moebench.cli.main import cli

    out = CliRunner().invoke(cli, [command, "--help"]).output
    assert new in out and old in out  # both listed, the shared name first
    assert out.index(new) <= out.index(old)
