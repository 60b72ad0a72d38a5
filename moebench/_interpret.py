"""The one place that turns on the Triton interpreter.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so this module is
imported first by the package. Without a CUDA GPU the kernels run on the CPU
under the interpreter (correctness only: its timings are not GPU performance).
A value the user set is left alone.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def interpreting() -> bool:
    """True when Triton kernels run on the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
