"""Whether Triton kernels run on the CPU interpreter, decided in one place.

``interpreting()`` is the one answer every command and test asks: the value of
``TRITON_INTERPRET`` where the user set it, else whether there is no CUDA GPU.
Triton reads the variable when a kernel is decorated, so importing this module
(``moebench.kernels`` and the tests' conftest do, before any kernel) sets it to
the same answer where it is unset. Interpreter runs check correctness only:
their timings are not GPU performance.
"""

from __future__ import annotations

import functools
import os

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


use_interpreter_without_gpu()
