"""What stopped a map before every row was done, said in one line: what happened, how many
rows are done, what to do (``Tally`` shows the short label on the bar and emits the line).

- a budget (``map(budget=)``): a ``MapStoppedWarning`` (``warnings.warn``), since the map
  itself returns normally (``on_error="collect"``, or ``into=``) or raises
  ``BudgetExceededError``, which names one item, not the map's counts;
- an error (``on_error="raise"``) or an interrupt (Ctrl-C): a log warning on
  ``hypernodes_dist.map`` (the exception itself reaches the caller).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Mapping
from types import FrameType
from typing import NamedTuple

from hypernodes_dist.errors import BudgetExceededError, MapStoppedWarning

__all__ = ["Stop", "budget_stop", "error_stop", "emit", "Kept"]

log = logging.getLogger("hypernodes_dist.map")


class Kept(NamedTuple):
    """Where a map's finished rows survive a stop: ``"into"`` (``where``: the directory),
    ``"cache"``, or ``""`` (nowhere: results of a plain map live in memory)."""

    how: str
    where: str = ""

    def say(self, into: str, cache: str, nowhere: str) -> str:
        """The one of three phrasings that fits where the rows are kept."""
        return into if self.how == "into" else cache if self.how == "cache" else nowhere


class Stop(NamedTuple):
    """A map's stop: ``label`` for the bar, ``message`` the one line, ``budget`` whether a
    budget stopped it (a warning) or an error/interrupt (a log line)."""

    label: str
    message: str
    budget: bool


def _limits(limits: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{q!r}: {v:g}" for q, v in limits.items()) + "}"


def _rows(n: int, unit: str) -> str:
    return f"{n:,} {unit}" + ("" if n == 1 else "s")


def _of(done: int, total: int | None, unit: str) -> str:
    return f"{done:,} of {_rows(total, unit)}" if total is not None else _rows(done, unit)


def budget_stop(limits: Mapping[str, float], done: int, total: int | None, unit: str,
                kept: Kept, refused: int | None = None) -> Stop:
    """The budget reached after ``done`` rows (``refused``: rows that failed with
    ``BudgetExceededError``, a plain map under ``on_error="collect"``)."""
    left = refused if refused is not None else (None if total is None else total - done)
    what = "" if left is None else f": {_rows(left, unit)} not " + (
        "run (BudgetExceededError in MapResult.errors)" if refused is not None
        else "written" if kept.how == "into" else "finished")
    again = "rerun the same map with a larger budget to continue"
    keep = kept.say(f"the finished rows are kept in {kept.where}: {again}",
                    f"finished {unit}s are cached (not paid again): {again}",
                    f"{again} (with cache= or into=, or the rerun pays for every {unit} again)")
    message = f"budget {_limits(limits)} reached after {_of(done, total, unit)}{what}; {keep}"
    return Stop(f"stopped: budget {_limits(limits)} reached", message, True)


def error_stop(exc: BaseException, done: int, total: int | None, unit: str,
               kept: Kept) -> Stop:
    """An exception raised out of the map after ``done`` rows."""
    name = type(exc).__name__
    interrupted = isinstance(exc, KeyboardInterrupt)
    where = getattr(exc, "hn_node", None)
    cause = "interrupted" if interrupted else f"stopped by {name}" + (
        f" in node {where!r}" if where else "")
    keep = kept.say(
        f"rows already written to {kept.where} are kept: rerun the same map to continue",
        f"finished {unit}s are in the cache: rerun the same map to continue",
        f"results of finished {unit}s are lost; pass cache= (or map into=) to keep them "
        "across a stop")
    fix = "" if interrupted else " (fix the error, or pass on_error=\"collect\")"
    label = "interrupted" if interrupted else f"stopped: {name}"
    return Stop(label, f"map {cause} after {_of(done, total, unit)}; {keep}{fix}", False)


def is_budget(exc: BaseException | None) -> bool:
    return isinstance(exc, BudgetExceededError) or type(exc).__name__ == "BudgetExceededError"


def emit(stop: Stop) -> None:
    """The one line: a ``MapStoppedWarning`` for a budget (pointing at the caller's line
    that started the map), a log warning otherwise."""
    if stop.budget:
        warnings.warn(stop.message, MapStoppedWarning, stacklevel=_caller_level())
    else:
        log.warning("%s", stop.message)


_OURS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
         os.path.dirname(contextlib.__file__) + os.sep + "contextlib")


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this package (and ``contextlib``)."""
    frame: FrameType | None = sys._getframe(2)  # emit's caller
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_OURS):
        frame, level = frame.f_back, level + 1
    return level
