"""moebench's own Triton kernels.

The package entry (``moebench/__init__.py``) has ``moebench._interpret`` decide TRITON_INTERPRET before Triton is
first imported; importing it here as well covers a Triton imported before moebench (it warns, on the CPU).
"""

from moebench import _interpret  # noqa: F401
