"""Errors a user can cause: the CLI prints them as one line and exits 2."""

import reprlib

SHORT = 60  # the characters of a value an error line quotes: enough to recognize it, never a whole file

# repr within bounds: a value of a million items (or a string of a million characters) is never formatted whole
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, SHORT + 2, SHORT, SHORT
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6


class UserError(Exception):
    """Bad input from the user (unknown model, malformed spec, impossible shape...).

    The message is a single line that says what is wrong and, where it helps,
    what would be accepted instead.
    """


def short(value: object, n: int = SHORT, quote: bool = True) -> str:
    """``value`` as an error line quotes it: its repr (``quote``; else its str), at most ``n`` characters, cut
    with "..."; formatting never walks more than a few items of a container."""
    text = _REPR.repr(value) if quote else str(value)[:n + 1]
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


def one_line(e: BaseException) -> str:
    """``e`` as the one line a result row carries: its type and the first line of its message."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return f"{type(e).__name__}: {first}"[:300]


def os_error_line(e: OSError) -> str:
    """An OSError on a file or folder the user named (``--out`` a file, a read-only folder...) as one line."""
    where = e.filename if e.filename is not None else ""
    if e.filename2 is not None:
        where = f"{where} -> {e.filename2}"
    if isinstance(e, (FileExistsError, NotADirectoryError)):
        why = "a file is in the way where a folder is needed"
    else:
        why = (e.strerror or str(e) or type(e).__name__).strip()
    return f"{where}: {why}" if where else why
