"""Files written whole or not at all: a temporary file in the same folder, then a rename.

Every file moebench writes for people or programs to read back (meta.json, tables, pages) goes through
here, so a run stopped mid-write leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temp file in the same folder (created if missing), then rename: no reader sees half a file.

    The temp file is created with the permissions of any new file (0666 less the umask), not the 0600 of
    ``tempfile``, so the renamed file reads like one written in place.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj) -> None:
    """``obj`` as indented JSON, written atomically (``write_text_atomic``)."""
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")
