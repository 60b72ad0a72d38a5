"""Helpers several test modules share."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def garbage_from_empty(monkeypatch, byte: int = 0xFF) -> None:
    """For the test: every tensor ``torch.empty`` makes starts as garbage (all bytes 0xFF: NaN floats, -1
    integers), so a launch that reads what no launch wrote shows in the result. ``byte=0x4F`` gives large finite
    floats instead (3.5e9 in float32), which a maximum does not skip as Triton's skips NaN."""
    real_empty = torch.empty

    def dirty_empty(*size, **kw):
        t = real_empty(*size, **kw)
        if t.numel():
            t.view(-1).view(torch.uint8).fill_(byte)
        return t
    monkeypatch.setattr(torch, "empty", dirty_empty)


def declared_do_not_specialize(kernel) -> tuple:
    """The do_not_specialize list a kernel was decorated with (JITFunction, or the interpreter's wrapper)."""
    if hasattr(kernel, "do_not_specialize"):  # triton.runtime.jit.JITFunction (GPU)
        return tuple(kernel.do_not_specialize)
    if hasattr(kernel, "kwargs"):  # triton.runtime.interpreter.InterpretedFunction
        return tuple(kernel.kwargs.get("do_not_specialize") or ())
    pytest.skip(f"this triton's {type(kernel).__name__} does not expose do_not_specialize")


def moebench_in_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``moebench ARGS`` through its entry point (``cli.main.main``, where every error becomes one line and an
    exit status) in this process: the command's exit status, stdout and stderr, without a new interpreter that
    imports torch again (seconds of CPU each). Tests of what only a fresh process shows (signals, what an
    import loads, variables read at import) start one instead."""
    from moebench.cli.main import main

    out, err, argv, here = io.StringIO(), io.StringIO(), sys.argv, os.getcwd()
    sys.argv = ["moebench", *args]
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
        os.chdir(here)
    return subprocess.CompletedProcess(["moebench", *args], code, out.getvalue(), err.getvalue())
