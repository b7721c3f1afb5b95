"""The check's judges: the replay model, the exact verification and every judgment.

Each judge follows ``Judge`` (``protocol``): the model of what each replay must produce
(``BatchModel``, ``ModelStep``), the table verification against it (``TableVerifier``), and the
decode step's judgments (``STEP_JUDGES``).
"""

from importlib import import_module

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


def __getattr__(name: str) -> object:
    module = _DEFINED_IN.get(name)
    if module is None:  # a submodule not yet imported is found by the import system then
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # found once: later lookups do not come here
    return value
