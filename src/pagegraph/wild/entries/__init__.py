"""One module a public bug, each defining ``BUG``, a ``pagegraph.wild.WildBug``.

Nothing else lives here: ``pagegraph.wild.corpus`` finds the entries by listing this package's
modules (``entries()``, ``entry(key)``), and ``__all__`` names those modules.
"""

import pkgutil

__all__ = sorted(info.name for info in pkgutil.iter_modules(__path__))
