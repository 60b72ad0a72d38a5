"""Whether Triton kernels run on the CPU interpreter, decided in one place.

``interpreting()`` is the one answer every command and test asks: the value of
``TRITON_INTERPRET`` where the user set it, else whether there is no CUDA GPU.
Triton reads the variable when it is imported, so importing this module sets it
to the same answer where it is unset; the package entry (``moebench/__init__.py``)
imports it the moment Triton is first imported, whoever imports it. Interpreter
runs check correctness only: their timings are not GPU performance.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings

_VAR = "TRITON_INTERPRET"


@functools.cache
def cuda_available() -> bool:
    """True when PyTorch sees a CUDA GPU; asked once (the kernels' launchers ask on every launch)."""
    import torch

    return torch.cuda.is_available()


def interpreting() -> bool:
    """True when Triton kernels run on the CPU interpreter: TRITON_INTERPRET if set, else no CUDA GPU."""
    value = os.environ.get(_VAR)
    if value is not None:
        return value.strip() not in ("", "0")
    return not cuda_available()


def use_interpreter_without_gpu() -> None:
    """Set TRITON_INTERPRET=1 where there is no CUDA GPU and the user left it unset."""
    if _VAR not in os.environ and not cuda_available():
        os.environ[_VAR] = "1"
        if "triton" in sys.modules:  # imported before moebench: it has read the variable already
            warnings.warn("Triton was imported before moebench on a machine without a CUDA GPU, so its kernels "
                          "will not run on the interpreter; set TRITON_INTERPRET=1 before importing triton",
                          stacklevel=2)


use_interpreter_without_gpu()
