"""Test set-up: the Triton interpreter is on for the CPU test run.

``moebench._interpret`` sets TRITON_INTERPRET when no GPU is present; importing it here, before any test
module decorates a kernel, keeps that the one place.
"""

from moebench import _interpret  # noqa: F401
