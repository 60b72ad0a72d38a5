"""Run folders on disk: the row schema, writing and reading them, resuming a stopped run, files written whole."""
