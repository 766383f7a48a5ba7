"""``MapStop``: a dataset map told to stop, seen by every worker at its next step.

A map stops when a row fails under ``on_error="raise"``, when its budget is spent, or on
Ctrl-C in the driver. Whatever stops it, nothing finished is thrown away: each worker
ends its step (the calls in flight finish), its finished rows are written, and it starts
no new step or part (``commit.run_parts`` asks ``stopped()`` before each). The flag is a
shared value of the limits backend (every process of the machine; the cluster on
``distributed``), under the map's run id, like the budget's totals.

``on_ctrl_c(stop)`` (the driver, during the map): the first Ctrl-C sets the flag and says
so on stderr instead of raising; the map then raises ``KeyboardInterrupt`` once everything
finished is written. A second Ctrl-C raises at once (rows in flight are lost).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hypernodes_dist.policies.limits import limiter

__all__ = ["MapStop", "on_ctrl_c", "stopping"]


@dataclass
class MapStop:
    """The stop flag of one map (picklable: it travels with the part task)."""

    key: str  # the map's run-id prefix
    seen: bool = field(default=False, compare=False)  # this process saw it set
    # in the driver: the value as the engine's workers see it (``Engine.driver_shared``,
    # e.g. a cluster's scheduler), when not the driver's own backend
    where: Any = field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        return f"stop-{self.key}"

    def _value(self) -> Any:
        return self.where if self.where is not None else limiter("shared", self.name)

    def set(self) -> None:
        """Every worker stops at its next step."""
        self.seen = True
        self._value().update(lambda _: True)

    def stopped(self) -> bool:
        if not self.seen:
            self.seen = bool(self._value().get())
        return self.seen

    def close(self) -> None:
        """Forget the flag (the driver, once the map is over)."""
        self._value().remove()

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key, "seen": False, "where": None}


@contextmanager
def on_ctrl_c(stop: MapStop) -> Iterator[list[bool]]:
    """While the block runs in the main thread with Python's default Ctrl-C handler, the
    first Ctrl-C sets ``stop`` (from a helper thread: the shared value takes locks) and
    appends ``True`` to the yielded list; the second raises ``KeyboardInterrupt``."""
    pressed: list[bool] = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield pressed
        return
    setter = threading.Thread(target=stop.set, name="hn-stop", daemon=True)

    def handler(signum: int, frame: Any) -> None:
        if pressed:
            raise KeyboardInterrupt
        pressed.append(True)
        stop.seen = True  # this process's workers see it now; others through the backend
        print("\nCtrl-C: stopping the map -- the rows in flight finish and every finished "
              "row is written (a rerun continues from there); Ctrl-C again to stop now",
              file=sys.stderr, flush=True)
        setter.start()

    signal.signal(signal.SIGINT, handler)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if pressed:  # the flag is set before the map forgets it (``MapStop.close``)
            setter.join()


@contextmanager
def stopping(stop: MapStop) -> Iterator[list[bool]]:
    """The driver's side of a map's stop while the block runs: Ctrl-C sets it
    (``on_ctrl_c``), and the flag is forgotten at the end, whatever happened."""
    with on_ctrl_c(stop) as pressed:
        try:
            yield pressed
        finally:
            stop.close()
