"""Errors a user can cause: the CLI prints them as one line and exits 2."""


class UserError(Exception):
    """Bad input from the user (unknown model, malformed spec, impossible shape...).

    The message is a single line that says what is wrong and, where it helps,
    what would be accepted instead.
    """


def one_line(e: BaseException) -> str:
    """``e`` as the one line a result row carries: its type and the first line of its message."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return f"{type(e).__name__}: {first}"[:300]
