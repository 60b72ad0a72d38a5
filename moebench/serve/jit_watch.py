"""Counting the kernel variants Triton builds while code runs, and twins of the layer's kernels that specialize
on token counts.

``CompileWatch`` counts every variant Triton builds in this process between ``begin`` and ``end``: through
Triton's JIT hooks (``triton.knobs.runtime.jit_cache_hook`` before a build, ``jit_post_compile_hook`` after,
Triton 3.4 and later), each event timed by its pair of hooks and marked ``from_disk`` where the build added
nothing to the on-disk cache (a load, not a compile); where the hooks are missing, by the growth of the
watched kernels' in-memory caches (``JITFunction.device_caches``), untimed. On the interpreter nothing is
built, so there is nothing to count: ``method`` says "interpreter" and ``end`` returns None, not 0.

``specialized`` swaps the layer's kernels that declare ``do_not_specialize`` for twins that do not (the same
function, every other decorator argument kept), so a replay shows what the token-count opt-out saves.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# The modules whose JIT kernels the triton path launches (fused_moe calls gemm1's and gemm2's by the names it
# imported; align and act_quant call their own).
KERNEL_MODULES = ("moebench.kernels.gemm1", "moebench.kernels.gemm2", "moebench.kernels.align",
                  "moebench.kernels.act_quant", "moebench.kernels.fused_moe")
_HOOKS = ("jit_cache_hook", "jit_post_compile_hook")  # before and after a build


@dataclass(frozen=True)
class CompileEvent:
    """One kernel variant built: by which kernel, while which request ran, how long it took and whether it
    came from Triton's on-disk cache (None where the count came from cache sizes, which tell neither)."""

    kernel: str
    request: int | None
    seconds: float | None
    from_disk: bool | None


def is_kernel(obj) -> bool:
    """Whether ``obj`` is a Triton JIT function (compiled, or the interpreter's wrapper)."""
    from triton.runtime.jit import JITFunction

    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - every Triton 3 has it
        InterpretedFunction = JITFunction
    return isinstance(obj, (JITFunction, InterpretedFunction))


def layer_kernels(modules: tuple[str, ...] = KERNEL_MODULES) -> dict[str, object]:
    """The JIT functions of ``modules`` by function name, each once (device helpers included: they are
    never launched, so their caches stay empty)."""
    import importlib

    found: dict[str, object] = {}
    for name in modules:
        for value in vars(importlib.import_module(name)).values():
            if is_kernel(value):
                found.setdefault(value.fn.__name__, value)
    return found


def cached_variants(kernel) -> int | None:
    """Variants in ``kernel``'s in-memory caches, over all devices; None where this Triton keeps them in a way
    this does not know (the interpreter keeps none)."""
    caches = getattr(kernel, "device_caches", None)
    if caches is None:
        return None
    total = 0
    for entry in list(caches.values()):
        cache = entry[0] if isinstance(entry, tuple) else entry  # (kernel_cache, key_cache, target, ...)
        try:
            total += len(cache)
        except TypeError:
            return None
    return total


def _entries(folder: Path | None) -> set[str]:
    try:
        return set(os.listdir(folder)) if folder is not None else set()
    except OSError:
        return set()


class CompileWatch:
    """Counts the variants Triton builds per request while active (a context manager).

    ``method``: "hooks" (Triton's JIT hooks, chained after any hook already installed and restored on exit),
    "caches" (the growth of ``kernels``' caches, taken at ``begin`` and ``end``) or "interpreter" (nothing is
    built). ``cache_dir``: Triton's on-disk cache, whose new entries tell a compile from a load.
    """

    def __init__(self, kernels: dict[str, object] | None = None, cache_dir: Path | str | None = None,
                 interpreter: bool | None = None, use_hooks: bool | None = None):
        if interpreter is None:
            from moebench._interpret import interpreting

            interpreter = interpreting()
        self.kernels = kernels if kernels is not None else ({} if interpreter else layer_kernels())
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        if use_hooks is None:
            use_hooks = _hooks_available()
        self.method = "interpreter" if interpreter else "hooks" if use_hooks else "caches"
        self.events: list[CompileEvent] = []
        self.request: int | None = None
        self.new_cache_entries: int | None = None  # in the last request (``end``)
        self._first = 0  # index in ``events`` of the current request's first
        self._sizes: dict[str, int | None] = {}
        self._entries: set[str] = set()
        self._pending: dict[tuple[str, str], tuple[float, set[str]]] = {}
        self._previous: dict[str, object] = {}

    def __enter__(self) -> CompileWatch:
        if self.method == "hooks":
            from triton import knobs

            self._previous = {h: getattr(knobs.runtime, h) for h in _HOOKS}
            knobs.runtime.jit_cache_hook = self._before
            knobs.runtime.jit_post_compile_hook = self._after
        return self

    def __exit__(self, *exc) -> None:
        if self.method == "hooks" and self._previous:
            from triton import knobs

            for hook, value in self._previous.items():
                setattr(knobs.runtime, hook, value)
            self._previous = {}

    def begin(self, request: int) -> None:
        """Start counting for ``request``."""
        self.request = request
        self._first = len(self.events)
        self._entries = _entries(self.cache_dir)
        if self.method == "caches":
            self._sizes = {name: cached_variants(k) for name, k in self.kernels.items()}

    def end(self) -> list[CompileEvent] | None:
        """The variants built since ``begin``; None on the interpreter (nothing is built to count)."""
        if self.method == "interpreter":
            self.new_cache_entries = None
            return None
        if self.method == "caches":
            for name, kernel in self.kernels.items():
                before, now = self._sizes.get(name), cached_variants(kernel)
                if before is not None and now is not None:
                    self.events += [CompileEvent(name, self.request, None, None)] * max(0, now - before)
        self.new_cache_entries = len(_entries(self.cache_dir) - self._entries) if self.cache_dir else None
        self._pending.clear()  # a build whose second hook never came (it raised) is not counted
        return self.events[self._first:]

    # Triton calls both hooks with keyword arguments only: key, repr, fn, compile, is_manual_warmup, ...
    def _before(self, **kwargs):
        self._pending[_event_key(kwargs)] = (time.perf_counter(), _entries(self.cache_dir))
        previous = self._previous.get("jit_cache_hook")
        skip = previous(**kwargs) if previous is not None else None
        if skip:  # the previous hook skips the build: no second hook comes
            self._pending.pop(_event_key(kwargs), None)
        return skip

    def _after(self, **kwargs):
        name, _ = key = _event_key(kwargs)
        started = self._pending.pop(key, None)
        if started is not None:
            seconds = time.perf_counter() - started[0]
            written = self.cache_dir is not None and bool(_entries(self.cache_dir) - started[1])
            self.events.append(CompileEvent(name, self.request, seconds,
                                            None if self.cache_dir is None else not written))
        previous = self._previous.get("jit_post_compile_hook")
        return previous(**kwargs) if previous is not None else None


def _hooks_available() -> bool:
    try:
        from triton import knobs
    except ImportError:
        return False
    return all(hasattr(knobs.runtime, h) for h in _HOOKS)


def _event_key(kwargs: dict) -> tuple[str, str]:
    """(kernel name, variant key) of a hook call; the name from ``fn`` (Triton's JitFunctionInfo)."""
    fn = kwargs.get("fn")
    name = getattr(fn, "name", None) or str(kwargs.get("repr", "?")).split("[", 1)[0]
    return name.rsplit(".", 1)[-1], str(kwargs.get("key"))


# ---- kernels that specialize on token counts ------------------------------------------------------------

def declared_do_not_specialize(kernel) -> tuple:
    """The do_not_specialize list ``kernel`` was decorated with (JITFunction, or the interpreter's wrapper)."""
    if hasattr(kernel, "kwargs"):  # triton.runtime.interpreter.InterpretedFunction keeps the decorator's
        return tuple(kernel.kwargs.get("do_not_specialize") or ())
    return tuple(getattr(kernel, "do_not_specialize", None) or ())


def decorator_args(kernel) -> dict:
    """The arguments ``triton.jit`` was given for ``kernel`` (those this Triton's ``jit`` takes), as far as
    the kernel object keeps them."""
    import triton

    names = [n for n in inspect.signature(triton.jit).parameters if n != "fn"]
    if hasattr(kernel, "kwargs"):
        return {n: kernel.kwargs.get(n) for n in names}
    attribute = {"repr": "_repr"}  # JITFunction keeps repr as _repr
    return {n: getattr(kernel, attribute.get(n, n), None) for n in names}


def specializing_twin(kernel):
    """``kernel`` again from the same function and decorator arguments, less ``do_not_specialize``."""
    import triton

    args = decorator_args(kernel)
    args["do_not_specialize"] = None
    return triton.jit(kernel.fn, **args)


@contextmanager
def specialized(modules: tuple[str, ...] = KERNEL_MODULES) -> Iterator[dict[str, object]]:
    """Within the block, every moebench module attribute that holds one of ``modules``' kernels declaring
    ``do_not_specialize`` holds its specializing twin instead; yields the twins by name. Restored after."""
    originals = {n: k for n, k in layer_kernels(modules).items() if declared_do_not_specialize(k)}
    registry = _jit_registry()
    saved = dict(registry)
    twins = {n: specializing_twin(k) for n, k in originals.items()}
    twin_of = {id(k): (k, twins[n]) for n, k in originals.items()}  # the originals stay alive: ids stay theirs
    swapped: list[tuple[object, str, object]] = []
    try:
        for mod_name, module in list(sys.modules.items()):
            if module is None or not (mod_name == "moebench" or mod_name.startswith("moebench.")):
                continue
            for attr, value in list(vars(module).items()):
                original, twin = twin_of.get(id(value), (None, None))
                if value is original:
                    swapped.append((module, attr, value))
                    setattr(module, attr, twin)
        yield twins
    finally:
        for module, attr, value in reversed(swapped):
            setattr(module, attr, value)
        registry.clear()
        registry.update(saved)


def _jit_registry() -> dict:
    """Triton's name -> JITFunction registry (each new JITFunction enters itself), or a dict standing in."""
    try:
        from triton.runtime import jit
    except ImportError:  # pragma: no cover
        return {}
    registry = getattr(jit, "_triton_jit_function_registry", None)
    return registry if isinstance(registry, dict) else {}
