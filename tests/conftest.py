"""Test set-up: the Triton interpreter is on for the CPU test run, as for a user's script.

Importing ``moebench`` first leaves its finder on ``sys.meta_path``: whichever test module imports Triton first,
``moebench._interpret`` sets TRITON_INTERPRET (no GPU: on) before Triton reads it, as it does for a user.

On the interpreter, one repeated cost is cut for the test run (``_one_language_patch_per_launch``).
"""

import moebench  # noqa: F401


def _one_language_patch_per_launch() -> None:
    """Triton's interpreter patches ``triton.language`` for a kernel launch (``GridExecutor.__call__``) and
    restores it when the launch ends, and patches it again at every call of a ``@triton.jit`` helper inside the
    launch, though the launch has patched it already (about 40% of an fp8 kernel test's time, in
    ``inspect.getmembers``). Here a helper's call inside a launch skips that repeat where the language modules
    its globals hold (``triton.language``, ``triton.language.core``) were patched in this launch; a launch's own
    patch and restore, and any other call, are unchanged. Where the interpreter lacks the names this relies on,
    or kernels run on a GPU, nothing is changed."""
    from moebench._interpret import interpreting

    if not interpreting():
        return
    from triton.runtime import interpreter

    patch, scope_type = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "_LangPatchScope", None)
    launch = vars(getattr(interpreter, "GridExecutor", object)).get("__call__")
    if patch is None or scope_type is None or launch is None:
        return
    import inspect

    import triton.language as tl

    languages = (tl, tl.core)
    state = {"launches": 0, "patched": set()}  # launches in progress; the language modules the innermost patched

    def run_launch(self, *args, **kwargs):
        outer = state["patched"]
        state["launches"] += 1
        state["patched"] = set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            state["launches"] -= 1
            state["patched"] = outer

    def patch_once(fn):
        found = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in languages}
        if state["launches"] and found <= state["patched"]:
            return scope_type()  # a helper's call: the launch patched the language modules it sees already
        if state["launches"]:
            state["patched"] |= found
        return patch(fn)

    interpreter.GridExecutor.__call__ = run_launch
    interpreter._patch_lang = patch_once


_one_language_patch_per_launch()
