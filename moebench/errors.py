"""Errors a user can cause: the CLI prints them as one line and exits 2."""


class UserError(Exception):
    """Bad input from the user (unknown model, malformed spec, impossible shape...).

    The message is a single line that says what is wrong and, where it helps,
    what would be accepted instead.
    """
