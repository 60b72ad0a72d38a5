"""Tables re-timed on this GPU: two configs per M back to back (``pairs``), a table's drift (``retime``), a tune's
table merged with an engine's (``merge``), the fitted default checked on the tables and timed (``fitcheck``,
``fittime``). Each measures through ``workers.bench`` and writes a run folder that ``report`` reads."""
