"""Helpers several test modules share."""

from __future__ import annotations

import pytest
import torch


def garbage_from_empty(monkeypatch) -> None:
    """For the test: every tensor ``torch.empty`` makes starts as garbage (all bytes 0xFF: NaN floats, -1
    integers), so a launch that reads what no launch wrote shows in the result."""
    real_empty = torch.empty

    def dirty_empty(*size, **kw):
        t = real_empty(*size, **kw)
        if t.numel():
            t.view(-1).view(torch.uint8).fill_(0xFF)
        return t
    monkeypatch.setattr(torch, "empty", dirty_empty)


def declared_do_not_specialize(kernel) -> tuple:
    """The do_not_specialize list a kernel was decorated with (JITFunction, or the interpreter's wrapper)."""
    if hasattr(kernel, "do_not_specialize"):  # triton.runtime.jit.JITFunction (GPU)
        return tuple(kernel.do_not_specialize)
    if hasattr(kernel, "kwargs"):  # triton.runtime.interpreter.InterpretedFunction
        return tuple(kernel.kwargs.get("do_not_specialize") or ())
    pytest.skip(f"this triton's {type(kernel).__name__} does not expose do_not_specialize")
