"""One module a public bug, each defining ``BUG``, a ``pagegraph.wild.WildBug``."""
