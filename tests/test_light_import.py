"""`import moebench` and every `--help` stay light: neither loads torch or Triton (each command imports
what it needs when it runs). Checked in fresh interpreters, since this test run has torch loaded already."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "triton")


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)


def test_import_moebench_loads_no_torch():
    proc = _python("import moebench, sys; assert 'torch' not in sys.modules, 'torch'; "
                   "assert 'triton' not in sys.modules, 'triton'")
    assert proc.returncode == 0, proc.stderr


def _help_commands() -> list[list[str]]:
    from moebench.cli.main import cli

    return [[], *([name] for name in cli.commands)]


@pytest.mark.parametrize("command", _help_commands(), ids=lambda c: " ".join(c) or "moebench")
def test_help_loads_no_torch(command):
    """`moebench [COMMAND] --help` prints its usage with none of the heavy modules imported."""
    code = (
        "import sys\n"
        "from moebench.cli.main import main\n"
        f"sys.argv = ['moebench', *{command!r}, '--help']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage:") and "--help" in proc.stdout
