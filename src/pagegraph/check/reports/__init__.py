"""The report a check returns, and its decode-step section.

``Report`` holds the verdict, each property's ``PropertyResult`` and its ``Failure`` records,
and the buckets' figures (``BucketStats``); ``StepSection`` is the decode step's part.
"""

from importlib import import_module

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "BucketStats": "report",
    "Failure": "report",
    "PropertyResult": "report",
    "Report": "report",
    "StepSection": "step_report",
}

__all__ = [
    "BucketStats",
    "Failure",
    "PropertyResult",
    "Report",
    "StepSection",
]


def __getattr__(name: str) -> object:
    module = _DEFINED_IN.get(name)
    if module is None:  # a submodule not yet imported is found by the import system then
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # found once: later lookups do not come here
    return value
