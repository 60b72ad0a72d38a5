"""Names from user input that become parts of file and folder names: checked, so no write leaves its folder.

A sweep's name, a model's name (from a spec, a config.json, a run's rows), a device's name read from a run:
each ends up in a run folder's or a table file's name. ``check_part`` refuses one that could climb out of the
folder it is written in ("/", "\\\\", "..") or that the file system refuses or hides (empty, NUL and other control
characters, past ``MAX_PART`` characters).
"""

from __future__ import annotations

from moebench.errors import UserError, short

MAX_PART = 100  # a run folder adds a 15-character time and "-99": well within every file system's 255 bytes
_FORBIDDEN = frozenset("/\\") | frozenset(map(chr, range(32))) | {"\x7f"}


def why_not_part(name: object) -> str | None:
    """Why ``name`` cannot be a part of a file name, or None where it can."""
    if not isinstance(name, str) or not name.strip():
        return "is empty" if isinstance(name, str) else f"is {type(name).__name__}, not a name"
    if len(name) > MAX_PART:
        return f"is {len(name)} characters long, more than {MAX_PART}"
    bad = next((c for c in name if c in _FORBIDDEN), None)
    if bad is not None:
        return f"holds {bad!r}, which no file name part may"
    if name.strip(".") == "" or name.startswith("."):
        return "starts with '.' (a hidden or parent folder)"
    return None


def check_part(name: object, what: str) -> str:
    """``name`` where it can be a part of a file name; UserError naming ``what`` (and quoting a short prefix of
    the name) where not."""
    why = why_not_part(name)
    if why:
        raise UserError(f"{what} {short(name)} {why}")
    return name
