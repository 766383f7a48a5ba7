"""A back-off's width made to bind every process: units withheld from a shared semaphore.

A node's ``concurrency=N`` is a semaphore of N units in the limits backend, shared by
every process. When the API's back-off lowers the width to K (``aimd.Backoff``), N - K of
its units are *withheld*: taken out of circulation (owned by no process, counted in a
shared value next to the semaphore), so at most K calls run at once in total, whatever
the number of processes. Units free now are withheld at once; the rest is a debt that
each process pays with the units its finished calls return (``retire``: the unit is not
handed to a waiting call nor given back). A recovery gives withheld units back.

The semaphore must offer ``withhold(k) -> int`` (up to ``k`` free units now, not owned by
this process), ``retire()`` (a unit this process holds, withheld instead of returned) and
``restore(k)``: ``machine.KernelSemaphore`` and ``memory.MemorySemaphore`` do. A backend
whose semaphore does not (a cluster's, each operation a round trip) keeps the width per
process (``aimd.Places``). The shared value names the API that withheld the units: a
semaphore used for another API (the node's resource inputs changed) is given its units
back before the new one withholds.
"""

from __future__ import annotations

from typing import Any

from hypernodes_dist.policies.backend import SharedValue

__all__ = ["Shrink", "shrinkable"]


def shrinkable(sem: Any) -> bool:
    """Whether ``sem`` can withhold units (and is not a remote semaphore)."""
    return not getattr(sem, "remote", False) and all(
        callable(getattr(sem, name, None)) for name in ("withhold", "retire", "restore"))


class Shrink:
    """The units withheld from one semaphore of ``n`` units for the API ``api``."""

    def __init__(self, sem: Any, n: int, state: SharedValue, api: str) -> None:
        self.sem, self.n, self.state, self.api = sem, n, state, api
        self.able = shrinkable(sem)
        self.owed = 0  # units still to withhold, as last seen here (0: releases pay nothing)

    def resize(self, width: int) -> None:
        """Withhold (or give back) units so that ``width`` of the ``n`` circulate."""
        if not self.able:
            return
        target = self.n - max(1, min(self.n, width))
        if target == 0 and self.owed == 0 and self.state.get() is None:
            return  # nothing withheld, nothing to withhold: no write

        def change(old: Any) -> dict[str, Any]:
            held = self._held(old)
            if held < target:
                held += self.sem.withhold(target - held)
            elif held > target:
                self.sem.restore(held - target)
                held = target
            return {"api": self.api, "held": held, "target": target}

        self._note(self.state.update(change))

    def retire(self) -> bool:
        """A unit a finished call returns: withheld instead (True) while units are owed."""
        if not self.owed:
            return False
        retired = [False]

        def change(old: Any) -> Any:
            if not isinstance(old, dict) or old.get("api") != self.api:
                return old
            if old["held"] < old["target"]:
                self.sem.retire()
                retired[0] = True
                return {**old, "held": old["held"] + 1}
            return old

        self._note(self.state.update(change))
        return retired[0]

    def _held(self, old: Any) -> int:
        """Units withheld for this API (another API's are given back first)."""
        if not isinstance(old, dict):
            return 0
        if old.get("api") != self.api:
            if old.get("held"):
                self.sem.restore(int(old["held"]))
            return 0
        return int(old.get("held", 0))

    def _note(self, value: Any) -> None:
        ok = isinstance(value, dict) and value.get("api") == self.api
        self.owed = max(0, value["target"] - value["held"]) if ok else 0
