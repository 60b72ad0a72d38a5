"""Tile tables: the type (``table``), the best config per M from a run's rows (``pick``), the export formats
(``formats``) and ``export-configs`` (``export``), and the run-time lookup of moebench's own tables (``lookup``)."""
