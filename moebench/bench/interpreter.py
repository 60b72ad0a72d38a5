"""A sweep on the Triton interpreter (no CUDA GPU): what it runs in place of the GPU defaults the user did not
choose, and a warning where a shape is too large to run there in seconds."""

from __future__ import annotations

from dataclasses import replace

from moebench.bench.spec import GPU_MS, INTERPRETER_MS, Block, SweepSpec, union
from moebench.models import MoEShape
from moebench.paths.base import Target
from moebench.paths.registry import get_path

# weight elements (3 * E * hidden * I) one point may have for the interpreter to run it in seconds; tiny: 196,608.
# trace refuses a larger shape there; a sweep warns (interpreter_size_warning).
INTERPRETER_MAX_WEIGHTS = 1 << 22

# What the interpreter runs in place of the GPU defaults the user did not choose: bf16 dots come out wrong
# there, torch (the float32 reference) runs anywhere a GPU-only path cannot, and the GPU's grid of M takes
# minutes where INTERPRETER_MS takes seconds.
INTERPRETER_DTYPES = {"bf16": "fp16"}
INTERPRETER_PATH = "torch"


def _interpreter_dtypes(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return union(INTERPRETER_DTYPES.get(d, d) for d in dtypes)


def _cannot_run(spec: SweepSpec, block: Block, path_name: str, target: Target) -> str | None:
    """Why ``path_name`` runs none of ``block``'s points on ``target`` even in the interpreter's dtypes, or None."""
    friendly = replace(block, dtypes=_interpreter_dtypes(block.dtypes), paths=(path_name,))
    path = get_path(path_name)
    reasons = [path.supports(p, target) for p, _ in replace(spec, blocks=(friendly,)).points()]
    return reasons[0] if all(reasons) else None


def for_interpreter(spec: SweepSpec, target: Target, dtypes_given: bool = False, paths_given: bool = False,
                    ms_given: bool = False) -> tuple[SweepSpec, str | None]:
    """The sweep as the Triton interpreter can run it, and one line saying what changed (None: nothing did).

    Where the user gave no --dtype, bf16 becomes fp16; where no --path, a path that needs a GPU (it runs
    none of its block's points here, whatever the dtype) gives way to torch; where no --m, the GPU's
    default M list becomes the cpu spec's. What the user chose is kept, so validation refuses it with its
    reason. A spec's bf16, GPU-only paths and GPU grid change too: like the flags' defaults, they are
    choices made for a GPU.
    """
    swaps: dict[str, str] = {}  # what was there -> what takes its place, with why
    blocks = []
    for b in spec.blocks:
        if not dtypes_given:
            swaps.update((d, f"{INTERPRETER_DTYPES[d]} in place of {d} (the interpreter computes {d} tl.dot wrongly)")
                         for d in b.dtypes if d in INTERPRETER_DTYPES)
            b = replace(b, dtypes=_interpreter_dtypes(b.dtypes))
        if not paths_given:
            dropped = {n: why for n in b.paths if (why := _cannot_run(spec, b, n, target))}
            swaps.update((n, f"path {INTERPRETER_PATH} in place of {n} ({why.split(':')[0]})")
                         for n, why in dropped.items())
            if dropped:
                b = replace(b, paths=union([*(n for n in b.paths if n not in dropped), INTERPRETER_PATH]))
        if not ms_given and b.ms == GPU_MS:
            swaps["M"] = (f"M {','.join(map(str, INTERPRETER_MS))} in place of {','.join(map(str, GPU_MS))} "
                          "(the interpreter is slow)")
            b = replace(b, ms=INTERPRETER_MS)
        blocks.append(b)
    if not swaps:
        return spec, None
    note = f"No CUDA GPU, so: {'; '.join(swaps.values())}. --dtype, --path and --m choose."
    return replace(spec, blocks=tuple(blocks)), note


def weight_elements(shape: MoEShape) -> int:
    """The weight elements of one layer of ``shape``: w1 (gate and up) and w2 of every expert."""
    return 3 * shape.experts * shape.hidden * shape.intermediate


def interpreter_size_warning(spec: SweepSpec) -> str | None:
    """One line warning that the interpreter runs ``spec``'s largest shapes slowly (their weight elements per
    point against ``INTERPRETER_MAX_WEIGHTS``), or None where every shape is within it."""
    large = sorted((s for s in spec.shapes if weight_elements(s) > INTERPRETER_MAX_WEIGHTS), key=weight_elements,
                   reverse=True)
    if not large:
        return None
    points = sum(1 for p, _ in spec.points() if weight_elements(p.shape) > INTERPRETER_MAX_WEIGHTS)
    sizes = ", ".join(f"{s.name} {weight_elements(s):,} ({weight_elements(s) / INTERPRETER_MAX_WEIGHTS:.0f}x)"
                      for s in large)
    return (f"warning: {points} point(s) have more weight elements than the interpreter runs in seconds "
            f"({INTERPRETER_MAX_WEIGHTS:,}): {sizes}; each may take minutes or more. "
            "--model tiny or a smaller shape runs fast.")
