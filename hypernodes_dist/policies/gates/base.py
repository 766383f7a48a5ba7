"""A gate: one concern of a node's policy around each attempt of a call.

The guard (``execution/guard.py``) runs an attempt as

    for gate in gates:            waited += await gate.enter(entry)
    the call
    for gate in reversed(gates):  gate.exit(entry, error)   # those entered, error or None

A gate waits in ``enter`` (returning the seconds it waited, reporting each wait with
``entry.throttle``) or refuses the call by raising; ``exit`` gives back what ``enter`` took
and learns from the outcome. One coroutine serves sync and async callers (``syncio``):
``entry.sleep`` blocks for a caller without a loop, so ``enter`` never suspends there.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, ClassVar, Protocol

from hypernodes_dist.policies.usage import CALL, Usage

__all__ = ["Gate", "Entry", "Host", "NO_USAGE"]

NO_USAGE: Usage = {}


class Host(Protocol):
    """What an entry reports to and sleeps with (the guard)."""

    def event(self, kind: str, item: int | None, attempt: int, wait: float, reason: str
              ) -> None: ...

    def pause(self, seconds: float, blocking: bool, in_slot: bool) -> Awaitable[None]: ...


class Entry:
    """One attempt of a call as its gates see it.

    ``in_slot``: a gate holding a unit was entered (later waits keep the item's window
    place); ``handed``: the gates that hold were handed to the thread running a sync call
    under a timeout (it exits them when the call really ends); ``error``: what the attempt
    raised (set before the exits); ``before``: the execution's usage when the call started
    (guards with ``Gate.meters`` gates); ``told``: the wait the error asked for (Retry-After,
    set by the hold-off gate's exit; 0.0: none); ``gates``: the gates the attempt takes. The rarely set fields are class defaults:
    an attempt costs four assignments.
    """

    in_slot = handed = False
    error: BaseException | None = None
    before: Usage | None = None
    _metered: Usage | None = None
    told = 0.0
    kept: dict[int, Any] | None = None
    gates: tuple[Any, ...] = ()  # the gates this attempt takes (set by the guard)

    def __init__(self, host: Host, item: int | None, attempt: int, blocking: bool) -> None:
        self.host, self.item, self.attempt, self.blocking = host, item, attempt, blocking

    def throttle(self, wait: float, reason: str) -> None:
        """Report a wait of ``wait`` seconds before the call (a ``PolicyEvent``)."""
        self.host.event("throttle", self.item, self.attempt, wait, reason)

    def event(self, kind: str, wait: float, reason: str) -> None:
        self.host.event(kind, self.item, self.attempt, wait, reason)

    def sleep(self, seconds: float) -> Awaitable[None]:
        return self.host.pause(seconds, self.blocking, self.in_slot)

    def keep(self, gate: object, value: Any) -> None:
        """Remember ``value`` for ``gate``'s exit."""
        if self.kept is None:
            self.kept = {}
        self.kept[id(gate)] = value

    def kept_by(self, gate: object) -> Any:
        return None if self.kept is None else self.kept.get(id(gate))

    def metered(self) -> Usage:
        """What this attempt metered (the execution's usage now, less ``before``)."""
        if self._metered is None:
            before = self.before
            if before is None:
                self._metered = NO_USAGE
            else:
                usage = CALL.get() or NO_USAGE
                self._metered = {q: v - before.get(q, 0.0) for q, v in usage.items()
                                 if v != before.get(q)}
        return self._metered



class Gate(Protocol):
    """One concern of a policy. ``holds``: ``exit`` gives back a unit the running call uses
    (a sync call abandoned on timeout gives it back from its thread, when it really ends);
    ``meters``: ``exit`` reads ``entry.metered()``."""

    holds: ClassVar[bool]
    meters: ClassVar[bool]

    async def enter(self, entry: Entry) -> float:
        """Wait until the attempt may start (seconds waited); raise to refuse it."""
        ...

    def exit(self, entry: Entry, error: BaseException | None) -> None:
        """The attempt is over (``error``: what it raised, or ``None``)."""
        ...
