"""The checker: whether a builder is safe to replay in a CUDA graph, judged exactly.

Its inputs and entry points sit here: ``CheckConfig`` and ``load_scenario`` (a scenario file),
``plan_check`` (a check planned before it runs), ``check_replay_safety`` (the whole check) and
the ``Report`` it returns; ``pipeline`` holds the phases and the replay loop, ``judges`` every
judgment, ``reports`` the report.
"""

from ..runtime.lazy_exports import lazy_exports

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "check_replay_safety": "checker",
    "CheckConfig": "config",
    "load_scenario": "scenario",
    "CheckPlan": "plan",
    "PlanError": "plan",
    "plan_check": "plan",
    "Report": "reports.report",
    "CheckInterrupted": "signals",
    "stop_on_signals": "signals",
}

__all__ = [
    "CheckConfig",
    "CheckInterrupted",
    "CheckPlan",
    "PlanError",
    "Report",
    "check_replay_safety",
    "load_scenario",
    "plan_check",
    "stop_on_signals",
]


__getattr__ = lazy_exports(__name__, _DEFINED_IN)
