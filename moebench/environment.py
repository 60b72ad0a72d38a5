"""What a run records about the machine and the software it ran on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton

import moebench


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def git_commit() -> str | None:
    """The source commit: MOEBENCH_GIT_COMMIT if set (copies of the tree without .git), else git's HEAD."""
    env = os.environ.get("MOEBENCH_GIT_COMMIT")
    if env:
        return env
    commit = _run(["git", "rev-parse", "HEAD"], cwd=Path(moebench.__file__).parent)
    if commit and _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=Path(moebench.__file__).parent):
        commit += "-dirty"
    return commit


def device_name(device: torch.device | None = None) -> str:
    """The name rows and tables key a device by: the GPU's name as torch gives it (``device``, else the current
    one where there is a GPU), else "cpu (<machine>)"."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.machine()})"


def describe(interpreter: bool) -> dict:
    """Metadata stored in every run's meta.json."""
    gpu = {}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu = {
            "gpu_name": props.name,
            "gpu_capability": f"{props.major}.{props.minor}",
            "gpu_sms": props.multi_processor_count,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
            "cuda": torch.version.cuda,
        }
    return {
        "device_name": device_name(),
        **gpu,
        "interpreter": interpreter,
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "moebench": moebench.__version__,
        "git_commit": git_commit(),
        "command": " ".join(["moebench", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
