"""Process supervision, above the checker: checks run in child processes (``isolate``: one
fresh child per list of checks, its crash or hang reported as the check's verdict) and warm
worker processes that run many isolated checks each (``worker_pool``). The jobs and the
pytest plugin start checks through this layer; the checker below never imports it.
"""

from ..runtime.lazy_exports import lazy_exports

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "IsolatedError": "isolate",
    "Job": "isolate",
    "child_env": "isolate",
    "run_isolated": "isolate",
    "write_json_atomic": "isolate",
    "Task": "worker_pool",
    "WorkerPool": "worker_pool",
}

__all__ = [
    "IsolatedError",
    "Job",
    "Task",
    "WorkerPool",
    "child_env",
    "run_isolated",
    "write_json_atomic",
]


__getattr__ = lazy_exports(__name__, _DEFINED_IN)
