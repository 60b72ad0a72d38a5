"""The export formats of ``export-configs``, one module each, by ``--layout`` name: ``FORMATS``.

Each module says where its reader looks (``folder``, ``ENV_VAR``), what its files are named (``file_name``) and
hold (``file_text``), and which path's rows pick their configs (``PATH``); ``moebench.tables.export`` places and
writes them the same way for every format. Adding a format is one module here and one line in ``FORMATS``
(``README.md`` beside this file).
"""

from __future__ import annotations

from types import ModuleType

from moebench.errors import UserError
from moebench.tables.formats import moebench, sglang, vllm

FORMATS: dict[str, ModuleType] = {"vllm": vllm, "sglang": sglang, "moebench": moebench}


def get_format(layout: str) -> ModuleType:
    """The format module of ``layout``; an unknown name is a UserError listing the known ones."""
    try:
        return FORMATS[layout]
    except KeyError:
        raise UserError(f"unknown layout {layout!r}; choose one of: {', '.join(FORMATS)}") from None
