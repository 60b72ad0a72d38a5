"""Tuning over the declared space and its pruning rules (``space/``): the cost model, strategies, the hand-picked
candidates, a tune's run and tune-tables over the served shapes."""
