"""Every output read from run folders: tables, compare and variants, the gate, charts and the HTML page."""
