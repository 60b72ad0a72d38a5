"""Triton's on-disk kernel cache: where it is, pointing it elsewhere for a block, and the kernels in it.

``warmup`` counts the kernels a warm-up adds; ``trace`` replays from a fresh or a warmed cache. Triton reads
``TRITON_CACHE_DIR`` when it looks a kernel up, so the variable is set before the first compile.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE_ENV = "TRITON_CACHE_DIR"


def cache_dir() -> Path:
    """Where Triton caches compiled kernels now: $TRITON_CACHE_DIR, else Triton's own default
    (``triton.knobs.cache.dir``), else ~/.triton/cache."""
    if env := os.environ.get(CACHE_ENV):
        return Path(env)
    try:
        from triton import knobs

        return Path(knobs.cache.dir)
    except (ImportError, AttributeError):
        return Path.home() / ".triton" / "cache"


@contextmanager
def cache_dir_env(folder: Path | str | None) -> Iterator[None]:
    """TRITON_CACHE_DIR set to ``folder`` (where given) within the block, as it was after."""
    previous = os.environ.get(CACHE_ENV)
    if folder is not None:
        os.environ[CACHE_ENV] = str(folder)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = previous


def kernel_entries(folder: Path) -> frozenset[str]:
    """The compiled kernels in a Triton cache folder, as paths relative to it. Triton writes each kernel
    into a folder of its own (its hash), holding the kernel's metadata ``<name>.json``, its binaries and
    IRs, and ``__grp__<name>.json`` naming them; other folders hold launchers and libraries without a
    metadata file. Autotuner results (``*.autotune.json``) are not kernels."""
    if not folder.is_dir():
        return frozenset()
    return frozenset(
        str(p.relative_to(folder)) for p in folder.glob("*/*.json")
        if not p.name.startswith("__grp__") and not p.name.endswith(".autotune.json"))
