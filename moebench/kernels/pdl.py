"""Programmatic dependent launch (sm90): a launch whose programs may start while the previous launch in
the stream ends. Each such program must wait (``gdc_wait``) before it reads what an earlier launch wrote
or writes what one reads; when every program waits, the launch cannot end before the one it follows, so
the order of the stream holds for the launches after it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from moebench._interpret import interpreting


def has_pdl(device: torch.device) -> bool:
    """Whether launches on ``device`` can be programmatic dependents (sm90 and later, not the interpreter)."""
    return device.type == "cuda" and not interpreting() and torch.cuda.get_device_capability(device)[0] >= 9


def launch_kwargs(pdl: bool) -> dict:
    """A kernel's ``PDL`` constexpr and, where true, the launch option that makes it a dependent."""
    return {"PDL": True, "launch_pdl": True} if pdl else {"PDL": False}


@triton.jit
def start(PDL: tl.constexpr, WAIT: tl.constexpr = True):
    """A program's first step: if launched as a dependent (``PDL``), let the next launch start, then
    (``WAIT``) wait for the previous one."""
    if PDL:
        gdc_launch_dependents()
        if WAIT:
            gdc_wait()


@triton.jit
def wait(PDL: tl.constexpr):
    """If launched as a dependent, wait for the previous launch (after a ``start`` without ``WAIT``)."""
    if PDL:
        gdc_wait()
