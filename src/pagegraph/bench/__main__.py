"""``python -m pagegraph.bench``: the benchmark suite (``pagegraph bench`` by another name)."""

import sys

from .bench_runner import main

sys.exit(main())
