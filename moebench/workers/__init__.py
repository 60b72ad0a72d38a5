"""Worker processes: the pool contract (``task``), local and Ray pools, choosing one (``pools``), and what a
worker runs (``jobs``: first runs, checked timings); ``precompile`` compiles runs ahead on a compile pool."""
