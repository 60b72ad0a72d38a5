"""Test set-up: the Triton interpreter is on for the CPU test run, as for a user's script.

Importing ``moebench`` first leaves its finder on ``sys.meta_path``: whichever test module imports Triton first,
``moebench._interpret`` sets TRITON_INTERPRET (no GPU: on) before Triton reads it, as it does for a user.
"""

import moebench  # noqa: F401
