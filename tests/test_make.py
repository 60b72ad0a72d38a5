"""The Makefile's installs, read from `make -n` (what make would run) in a copy of the Makefile: bench installs the
package alone and says what its first run costs before anything; test adds the dev extra, also to a venv bench made."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
ENV = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # run under `make test`


def _dry_run(folder: Path, target: str) -> list[str]:
    proc = subprocess.run(["make", "-n", target], cwd=folder, capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.replace("\\\n", "").splitlines()  # a recipe line continued with a backslash is one command


def _note(folder: Path) -> str:
    """What ``make first-run-note`` prints (it runs only a test and an echo)."""
    return subprocess.run(["make", "-s", "first-run-note"], cwd=folder, capture_output=True, text=True,
                          timeout=60, env=ENV).stdout.strip()


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The Makefile and pyproject.toml in an empty folder: no .venv yet."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def test_a_first_bench_says_its_cost_then_installs_the_package_without_the_dev_extra(checkout):
    lines = _dry_run(checkout, "bench")
    assert lines[0].startswith("test -f .venv/.installed || echo")  # the note, before the install and the sweep
    assert _note(checkout).startswith("make bench: first run:") and " min " in _note(checkout)
    installs = [x for x in lines if "pip install" in x]
    assert any(x.endswith("pip install -q -e .") for x in installs) and not any("[dev]" in x for x in installs)
    assert lines[-1].endswith("-m moebench sweep")


def test_test_after_bench_adds_the_dev_extra_only(checkout):
    """A venv bench made (its stamp newer than pyproject.toml) gets the dev extra, not the package again."""
    venv = checkout / ".venv"
    venv.mkdir()
    (venv / ".installed").touch()
    past = (checkout / "pyproject.toml").stat().st_mtime - 60
    os.utime(checkout / "pyproject.toml", (past, past))
    installs = [x for x in _dry_run(checkout, "test") if "pip install" in x]
    assert installs == [".venv/bin/python -m pip install -q -e '.[dev]'"]
    assert not [x for x in _dry_run(checkout, "bench") if "pip install" in x] and _note(checkout) == ""


def test_baseline_runs_sweeps_quick_into_the_baseline_and_repeat_folders_of_the_gpu_and_commit(checkout):
    """``make baseline-runs``: BASELINE_RUNS quick sweeps into results/baselines/<gpu>-quick-<commit>/, then one
    into results/<gpu>-quick-repeat-<commit>/, each labelled with the commit (after a GPU check)."""
    (checkout / ".venv").mkdir()
    (checkout / ".venv" / ".installed").touch()  # installed: the dry run shows the recipe alone
    proc = subprocess.run(["make", "-n", "baseline-runs", "BASELINE_RUNS=5"], cwd=checkout, capture_output=True,
                          text=True, timeout=60, env=ENV)
    assert proc.returncode == 0, proc.stderr
    recipe = proc.stdout.replace("\\\n", "")
    assert "torch.cuda.is_available()" in recipe and "for i in $(seq 5)" in recipe
    assert recipe.count("-m moebench sweep quick") == 2
    assert "--out results/baselines/$gpu-quick-$commit" in recipe
    assert "--out results/$gpu-quick-repeat-$commit" in recipe
    assert recipe.count("MOEBENCH_GIT_COMMIT=$commit") == 2
