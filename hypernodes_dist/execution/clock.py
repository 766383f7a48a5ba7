"""``Clock``: when each call of one node over a column of items started and ended."""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat, starmap
from operator import itemgetter
from typing import Any

__all__ = ["Clock"]


class Clock:
    """``perf_counter`` start and end of each call of one node, aligned with its items.

    ``run`` reads the clock at C level: ``zip`` pulls one call from ``map`` (its value goes
    straight into ``out``), then one reading (that call's end, the next call's start); no
    Python frame and no object per call survives. Readings are kept as arrays of doubles
    (8 bytes each, untracked by the garbage collector, pickled as one block of bytes).
    """

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts = array("d")
        self.ends = array("d")

    def add(self, starts: Iterable[float], ends: Iterable[float]) -> None:
        self.starts.extend(starts)
        self.ends.extend(ends)

    def run(self, fn: Callable[..., Any], its: list[Iterator[Any]], out: list[Any]) -> None:
        ends = array("d")
        start = time.perf_counter()
        try:
            ends.extend(map(_second, zip(map(out.append, map(fn, *its)),
                                         starmap(time.perf_counter, repeat(())))))
        except BaseException:
            last = self._keep(ends, start)
            self.add((last,), (time.perf_counter(),))  # the failing call
            raise
        self._keep(ends, start)

    def _keep(self, ends: array[float], start: float) -> float:
        """Keep the finished calls' times; returns when the last one ended (``start``: none)."""
        if not ends:
            return start
        self.starts.append(start)
        self.starts.extend(ends[:-1])
        self.ends.extend(ends)
        return ends[-1]


_second = itemgetter(1)
