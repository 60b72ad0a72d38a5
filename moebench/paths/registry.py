"""The registry of whole-layer paths: one explicit dict, in the order ``--path`` lists them.

Adding a path is one module in this folder and one line here (``README.md`` beside this file).
"""

from __future__ import annotations

from moebench.errors import UserError
from moebench.paths.base import MoEPath
from moebench.paths.classic_down_path import ClassicDownPath
from moebench.paths.classic_path import ClassicPath
from moebench.paths.cutlass_path import CutlassPath
from moebench.paths.torch_ref import TorchReferencePath
from moebench.paths.triton_path import TritonPath

PATHS: dict[str, MoEPath] = {p.name: p for p in (TritonPath(), ClassicPath(), ClassicDownPath(), CutlassPath(),
                                                 TorchReferencePath())}


def get_path(name: str) -> MoEPath:
    try:
        return PATHS[name]
    except KeyError:
        raise UserError(f"unknown path {name!r}; known: {', '.join(PATHS)}") from None


def path_names() -> list[str]:
    return list(PATHS)
