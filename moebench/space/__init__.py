"""What the tile search may try, declared once: each tunable kernel's fields and values (``declared``) and the
rules that drop the configs that cannot compile or run, or cannot be the best (``prune``). The search (``tune/``)
and the fitted default (``tables.fitted``, which carries a tuned config to another shape) both read them, so this
folder sits below both."""
