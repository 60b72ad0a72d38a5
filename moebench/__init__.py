"""moebench: benchmark and autotune fused Mixture-of-Experts kernels on Hopper GPUs.

Importing the package imports neither torch nor Triton: the command line stays fast, and the kernels
(``moebench.kernels``) turn on the Triton interpreter where there is no GPU when they are first imported.
``moebench.fused_moe`` and ``moebench.config_for`` (``moebench.serve.api``) load them on first use.
"""

__version__ = "0.1.0"

_LAZY = {"fused_moe": "moebench.serve.api", "config_for": "moebench.serve.api"}  # attribute -> the module that holds it


def __getattr__(name: str):
    """The library entry points, imported (with torch and Triton) when first asked for."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'moebench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
