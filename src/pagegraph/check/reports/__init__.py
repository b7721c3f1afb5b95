"""The report a check returns, and its decode-step section.

``Report`` holds the verdict, each property's ``PropertyResult`` and its ``Failure`` records,
and the buckets' figures (``BucketStats``); ``StepSection`` is the decode step's part.
"""

from ...runtime.lazy_exports import lazy_exports

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


__getattr__ = lazy_exports(__name__, _DEFINED_IN)
