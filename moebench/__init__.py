"""moebench: benchmark and autotune fused Mixture-of-Experts kernels on Hopper GPUs.

Importing the package imports neither torch nor Triton: the command line stays fast. Triton reads
TRITON_INTERPRET when it is imported, and deciding it (``moebench._interpret``: no CUDA GPU, interpreter on)
needs torch, so the package entry leaves a finder on ``sys.meta_path`` that makes that decision the moment
Triton is first imported, by any module, then removes itself. ``moebench.fused_moe`` and
``moebench.config_for`` (``moebench.serve.api``) load the kernels on first use.
"""

import sys

__version__ = "0.1.0"

_LAZY = {"fused_moe": "moebench.serve.api", "config_for": "moebench.serve.api"}  # attribute -> the module that holds it


class _InterpreterBeforeTriton:
    """A meta path finder that finds nothing: asked for ``triton`` first, it runs ``moebench._interpret``'s
    decision (which sets TRITON_INTERPRET where there is no GPU) and leaves the import to the other finders."""

    def find_spec(self, name, path=None, target=None):
        if name == "triton":
            sys.meta_path.remove(self)
            from moebench import _interpret  # noqa: F401  (deciding is what importing it does)
        return None


if "triton" not in sys.modules and not any(isinstance(f, _InterpreterBeforeTriton) for f in sys.meta_path):
    sys.meta_path.insert(0, _InterpreterBeforeTriton())


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
