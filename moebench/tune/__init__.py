"""Tuning: the declared space, pruning rules, cost model, strategies, the hand-picked candidates, a tune's run
and tune-tables over the served shapes."""
