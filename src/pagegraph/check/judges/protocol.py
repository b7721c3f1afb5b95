"""The one protocol of a check's judges (``Judge``): each replay is handed to every judge as it
happens (``observe``: judged at once, or its comparison queued on the device with no sync), and
what a judge queued is folded into the properties when the replays' records are read back
(``settle``: a chunk of the tables' replays; every step of the decode step). A new reader or
kind adds judges; the pipeline that feeds them stays one.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from ..reports.report import PropertyResult

__all__ = ["JudgedAtOnce", "Judge"]

#: What a replay showed, as a judge of its pipeline receives it.
Seen = TypeVar("Seen", contravariant=True)


class Judge(Protocol[Seen]):
    """A judge of replays: ``observe`` takes what one replay showed, ``settle`` folds what it
    queued into ``props`` (the report's properties by name)."""

    def observe(self, seen: Seen) -> None: ...

    def settle(self, props: dict[str, PropertyResult]) -> None: ...


class JudgedAtOnce:
    """For a judge that judges each replay as it observes it: nothing is left to settle."""

    def settle(self, props: dict[str, PropertyResult]) -> None:
        return None
