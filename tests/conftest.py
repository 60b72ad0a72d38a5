"""Test set-up: the Triton interpreter is on for the CPU test run.

The package sets TRITON_INTERPRET itself when no GPU is present (moebench/_interpret.py);
importing it here, before any test module decorates a kernel, keeps that the one place.
"""

import moebench  # noqa: F401
