"""The one classifier of a run's failures: which exceptions are the GPU's (a config the device cannot hold, a
kernel that does not compile, what CUDA or PyTorch report as ``RuntimeError``), so they become a typed result or
row instead of a crash, and which type (``store.rows.FAILURES``) each one is.

Sweeps, the tuner's workers, ``bounds`` and ``fused_moe``'s fallback all ask here; a programming error (any
other exception) is none of these and propagates. Triton is imported only when a failure is classified.
"""

from __future__ import annotations


def gpu_errors() -> tuple[type[BaseException], ...]:
    """The exception types a GPU-side failure raises: out of resources, compile errors, CUDA's RuntimeError."""
    import triton

    return (RuntimeError, triton.runtime.errors.OutOfResources, triton.CompilationError)


def is_gpu_side(e: BaseException) -> bool:
    """Whether ``e`` is a failure of the GPU or its compiler rather than of the program."""
    return isinstance(e, gpu_errors())


def classify(e: BaseException) -> str:
    """The failure type of an exception a config's run raised: "resources" (shared memory, registers, GPU
    memory), "compile", or "error"."""
    import triton

    text = str(e).lower()
    if isinstance(e, triton.runtime.errors.OutOfResources) or "out of resource" in text or "out of memory" in text:
        return "resources"
    if isinstance(e, triton.CompilationError) or type(e).__name__ == "CompileTimeAssertionFailure":
        return "compile"
    return "error"


def out_of_resources(e: BaseException) -> bool:
    """Whether ``e`` is Triton's compile-time refusal of a config the device cannot hold (shared memory,
    registers)."""
    import triton

    return isinstance(e, triton.runtime.errors.OutOfResources)


def out_of_memory(failure: str | None, error: str | None) -> bool:
    """Whether a "resources" failure was the GPU's memory running out, not a config the device cannot hold."""
    return failure == "resources" and "out of memory" in (error or "").lower()
