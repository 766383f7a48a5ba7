"""The types every engine and the executor share: one map call (``MapJob``), a slice of
its items (``Chunk``), what every batch shares (``BatchSettings``) and what a batch gives
back (``BatchResult``). Engine plugins import these from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypernodes_dist.events import Event
from hypernodes_dist.plan import MISSING, Plan
from hypernodes_dist.results import NodeExecution

__all__ = ["MapJob", "Chunk", "BatchSettings", "BatchResult", "Sink", "NOT_RUN", "RAN", "HIT"]

NOT_RUN, RAN, HIT = 0, 1, 2


@dataclass
class BatchSettings:
    """What every batch of one map shares (picklable)."""

    session_id: str
    run_prefix: str
    select: tuple[str, ...] | None = None
    on_error: str = "raise"
    cache: Any = None
    want_events: bool = False
    concurrency: int | None = None  # async node calls in flight per batch (None: the batch)

    def run_id(self, index: int) -> str:
        return f"{self.run_prefix}{index}"


@dataclass
class Chunk:
    """Items ``offset .. offset+n`` of a map: their mapped columns and the broadcast inputs."""

    offset: int
    n: int
    columns: dict[str, Sequence[Any]]
    broadcast: dict[str, Any]

    def item(self, i: int) -> dict[str, Any]:
        row = dict(self.broadcast)
        for name, col in self.columns.items():
            row[name] = col[i]
        return row


@dataclass
class BatchResult:
    """The outcome of one batch, columnar: what the driver turns into ``GraphResult``s."""

    offset: int
    n: int
    outputs: dict[str, list[Any]]  # selected output columns, MISSING where an item has none
    errors: dict[int, BaseException] = field(default_factory=dict)  # local index -> error
    order: tuple[str, ...] = ()  # columnar: node order; codes[name][i] says NOT_RUN/RAN/HIT
    codes: dict[str, bytearray] = field(default_factory=dict)
    histories: list[list[NodeExecution]] | None = None  # per-item strategy
    events: list[Event] = field(default_factory=list)
    executed: int = 0
    hits: int = 0
    worker: str = ""
    run_prefix: str = ""

    def run_id_of(self, i: int) -> str:
        return f"{self.run_prefix}{self.offset + i}"

    def history_of(self, i: int) -> list[NodeExecution]:
        if self.histories is not None:
            return self.histories[i]
        return [
            NodeExecution(name, step, cached=self.codes[name][i] == HIT)
            for step, name in enumerate(n for n in self.order if self.codes[n][i])
        ]

    def row(self, i: int) -> dict[str, Any]:
        return {k: col[i] for k, col in self.outputs.items() if col[i] is not MISSING}



Sink = Callable[[BatchResult], None]


@dataclass
class MapJob:
    """One ``map`` call, ready to run: the plan, the expanded item columns, the settings."""

    plan: Plan
    columns: dict[str, list[Any]]
    broadcast: dict[str, Any]
    n: int
    settings: BatchSettings

    def chunk(self, start: int, stop: int) -> Chunk:
        """Items ``start .. stop`` as a ``Chunk`` (mapped columns sliced, broadcast shared)."""
        cols = {k: v[start:stop] for k, v in self.columns.items()}
        return Chunk(start, stop - start, cols, self.broadcast)

    def bounds(self, size: int) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` of consecutive chunks of at most ``size`` items."""
        size = max(1, int(size))
        for start in range(0, self.n, size):
            yield start, min(start + size, self.n)
