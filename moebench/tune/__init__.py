"""Tuning: the search space, its strategies, the worker pools that compile and run candidates, the run store."""
