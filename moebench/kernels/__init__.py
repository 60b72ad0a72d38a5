"""moebench's own Triton kernels.

``moebench._interpret`` is imported first: it turns on the Triton interpreter where there is no GPU,
which Triton reads when a kernel is decorated.
"""

from moebench import _interpret  # noqa: F401
