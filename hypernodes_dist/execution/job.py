"""The types every engine and the executor share: one map call (``MapJob``), a slice of
its items (``Chunk``), what every batch shares (``BatchSettings``) and what a batch gives
back (``BatchResult``). Engine plugins import these from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from hypernodes_dist.cache.base import Cache
from hypernodes_dist.events import Event
from hypernodes_dist.execution.batching import fit_size
from hypernodes_dist.execution.batchwait import BatchLink
from hypernodes_dist.execution.progress import ProgressChannel
from hypernodes_dist.missing import MISSING
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.budget import Budget
from hypernodes_dist.policies.usage import add_usage
from hypernodes_dist.results import NodeExecution

__all__ = ["MapJob", "Chunk", "BatchSettings", "BatchResult", "ColumnarResult", "RunsResult",
           "Sink", "NOT_RUN", "RAN", "HIT", "TimedSpan", "Paused"]

NOT_RUN, RAN, HIT = 0, 1, 2
_IS_RAN = bytes(int(code == RAN) for code in range(256))  # per-item code -> 1 if it ran
_IS_HIT = bytes(int(code == HIT) for code in range(256))


class TimedSpan(NamedTuple):
    """Calls ``first .. last`` (positions in a node's call order) timed together from
    ``start`` to ``end`` (``perf_counter``), or one by one by ``clock`` (``calls.Clock``)."""

    first: int
    last: int
    start: float
    end: float
    clock: Any = None


class Paused(NamedTuple):
    """An item paused at an interrupt (a nested graph's run): its name and value."""

    interrupt: str
    value: Any


@dataclass
class BatchSettings:
    """What every batch of one map shares (picklable)."""

    session_id: str
    run_prefix: str
    select: tuple[str, ...] | None = None
    on_error: str = "raise"
    cache: Cache | None = None
    want_events: bool = False
    concurrency: int | None = None  # async node calls in flight per batch (None: the batch)
    # a nested graph's run (Graph.as_node): interrupt answers, by interrupt name
    responses: dict[str, Any] | None = None
    handlers: dict[str, Callable[[Any], Any]] | None = None
    budget: Budget | None = None  # map(budget=...): metered calls stop once it is spent
    progress: ProgressChannel | None = None  # rows finished, sent to the driver as they end
    batch: BatchLink | None = None  # batch_api nodes: where calls are recorded and answered
    # a map's waiting items run again: position -> the item's index in the map
    items: Sequence[int] | None = None

    def item(self, index: int) -> int:
        """The map's index of the job's item ``index``."""
        return index if self.items is None else self.items[index]

    def run_id(self, index: int) -> str:
        return f"{self.run_prefix}{self.item(index)}"


@dataclass
class Chunk:
    """Items ``offset .. offset+n`` of a map: their mapped columns and the broadcast inputs."""

    offset: int
    n: int
    columns: Mapping[str, Sequence[Any]]
    broadcast: dict[str, Any]

    def item(self, i: int) -> dict[str, Any]:
        row = dict(self.broadcast)
        for name, col in self.columns.items():
            row[name] = col[i]
        return row


@dataclass
class BatchResult:
    """The outcome of one batch: what the driver turns into ``GraphResult``s. One type per
    shape: ``ColumnarResult`` (the columnar strategy and the item flow: a code per node and
    item) and ``RunsResult`` (the reactive scheduler: each item's history)."""

    offset: int
    n: int
    outputs: dict[str, list[Any]]  # selected output columns, MISSING where an item has none
    errors: dict[int, BaseException] = field(default_factory=dict)  # local index -> error
    events: list[Event] = field(default_factory=list)
    executed: int = 0
    hits: int = 0
    worker: str = ""
    run_prefix: str = ""
    paused: dict[int, Paused] = field(default_factory=dict)  # items paused at an interrupt
    # node -> local item (-1: the node's calls together) -> what it metered
    usage: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)  # node -> calls made (batch nodes:
    # function calls; the others: executions that ran)
    waiting: list[int] = field(default_factory=list)  # local items waiting for a batch

    def usage_totals(self) -> dict[str, dict[str, float]]:
        """Per node: ``calls`` (executions that ran; batch nodes: function calls) and the sum
        of every metered quantity (``MapResult.usage``)."""
        totals: dict[str, dict[str, float]] = {
            name: {"calls": ran} for name, ran in self.calls.items() if ran}
        for name, per_item in self.usage.items():
            total = totals.setdefault(name, {"calls": 0})
            for usage in per_item.values():
                add_usage(total, usage)
        return totals

    def run_id_of(self, i: int) -> str:
        return f"{self.run_prefix}{self.offset + i}"

    def history_of(self, i: int) -> list[NodeExecution]:
        """Item ``i``'s executions in plan order: outputs (those the map returns), start,
        duration and worker like ``run()``'s history (a cache hit took no time)."""
        raise NotImplementedError

    def all_hits(self) -> int:
        """How many items took every node from the cache (none ran)."""
        raise NotImplementedError

    def drop_outputs(self, i: int) -> None:
        """Item ``i`` failed after it ran (e.g. an output that does not pickle): its outputs
        go, from its columns and its history."""
        for col in self.outputs.values():
            col[i] = MISSING

    def row(self, i: int) -> dict[str, Any]:
        return {k: col[i] for k, col in self.outputs.items() if col[i] is not MISSING}


@dataclass
class RunsResult(BatchResult):
    """A batch the reactive scheduler ran item by item: each item's history as it ran."""

    histories: list[list[NodeExecution]] = field(default_factory=list)

    def history_of(self, i: int) -> list[NodeExecution]:
        return self.histories[i]

    def all_hits(self) -> int:
        return sum(1 for h in self.histories if h and all(ex.cached for ex in h))

    def drop_outputs(self, i: int) -> None:
        super().drop_outputs(i)
        for execution in self.histories[i]:
            execution.outputs = {}


@dataclass
class ColumnarResult(BatchResult):
    """A batch run node by node (columnar) or item by item under a window (item flow):
    ``codes[name][i]`` says NOT_RUN/RAN/HIT; histories are built when read."""

    order: tuple[str, ...] = ()  # node order
    codes: dict[str, bytearray] = field(default_factory=dict)
    # when each node's calls ran (``calls.py``), for the items' history
    times: dict[str, tuple[Sequence[int], list[TimedSpan]]] = field(default_factory=dict)
    clock: float = 0.0  # wall-clock seconds = perf_counter reading + clock
    started: float = 0.0  # the batch's start (wall clock): when its cache hits were read
    node_outputs: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def history_of(self, i: int) -> list[NodeExecution]:
        history = []
        for step, name in enumerate(n for n in self.order if self.codes[n][i]):
            hit = self.codes[name][i] == HIT
            started, duration = (self.started, 0.0) if hit else self._time_of(name, i)
            outputs = {o: self.outputs[o][i] for o in self.node_outputs.get(name, ())
                       if o in self.outputs and self.outputs[o][i] is not MISSING}
            usage = {} if hit else self.usage.get(name, {}).get(i) or {}
            history.append(NodeExecution(name, step, outputs=outputs, cached=hit,
                                         duration_ms=duration, started_at=started,
                                         worker=self.worker, usage=usage))
        return history

    def all_hits(self) -> int:
        ran = hit = 0  # one bit per item, as ints (no Python loop over the items)
        for codes in self.codes.values():
            ran |= int.from_bytes(codes.translate(_IS_RAN), "little")
            hit |= int.from_bytes(codes.translate(_IS_HIT), "little")
        return (hit & ~ran).bit_count()

    def _time_of(self, name: str, i: int) -> tuple[float, float]:
        """``(started_at, duration_ms)`` of item ``i``'s call of ``name``: its own reading,
        or its share of the span of calls timed together."""
        found = self.times.get(name)
        if found is None:
            return self.started, 0.0
        positions, spans = found
        k = self._position(name, positions, i)
        for first, last, t0, t1, clock in spans:  # TimedSpan
            if first <= k < last:
                if clock is not None:
                    start, end = clock.starts[k - first], clock.ends[k - first]
                else:
                    each = (t1 - t0) / (last - first)
                    start = t0 + (k - first) * each
                    end = start + each
                return start + self.clock, (end - start) * 1e3
        return self.started, 0.0

    def _position(self, name: str, positions: Sequence[int], i: int) -> int:
        if isinstance(positions, range):
            return (i - positions.start) // positions.step if i in positions else -1
        where = self.__dict__.setdefault("_where", {})
        index = where.get(name)
        if index is None:
            index = where[name] = {p: k for k, p in enumerate(positions)}
        return index.get(i, -1)


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
        """``(start, stop)`` of consecutive chunks of at most ``size`` items (rounded up to
        a multiple of the plan's largest ``batch_size``: full batch-node calls)."""
        size = fit_size(self.plan, size)
        for start in range(0, self.n, size):
            yield start, min(start + size, self.n)
