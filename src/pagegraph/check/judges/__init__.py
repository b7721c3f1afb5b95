"""The check's judges: the replay model, the exact verification and every judgment.

Each judge follows ``Judge`` (``protocol``): the model of what each replay must produce
(``BatchModel``, ``ModelStep``), the table verification against it (``TableVerifier``), and the
decode step's judgments (``STEP_JUDGES``).
"""

from ...runtime.lazy_exports import lazy_exports

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "Judge": "protocol",
    "BatchModel": "verify",
    "ModelStep": "verify",
    "TableVerifier": "verify",
    "STEP_JUDGES": "step_judges",
}

__all__ = [
    "BatchModel",
    "Judge",
    "ModelStep",
    "STEP_JUDGES",
    "TableVerifier",
]


__getattr__ = lazy_exports(__name__, _DEFINED_IN)
