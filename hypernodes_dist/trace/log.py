"""The trace value: the first ``n`` events of an append-only log (appended to by its newest
version, else copied), read through a fold memoised per log: an older version read after
the memo went past it folds its own, once. And ``TraceCollector``, which builds one."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from hypernodes_dist.events import BatchEvent, Event

from .fold import Edge, Fold, TraceNode, handler, kept


class _Log:  # base: the fold before ``events`` (never changed); memo: the fold of a prefix
    def __init__(self, base: Fold, events: list[Any]) -> None:
        self.base, self.events, self.lock = base, events, threading.RLock()
        self.memo: Fold | None = None


class Trace:
    """An immutable execution trace (see ``hypernodes_dist.trace``); build it with
    ``reduce_event``. Equal traces have equal records and edges."""
    __slots__ = ("_log", "_n", "_own")

    def __init__(self, log: _Log, n: int) -> None:
        self._log, self._n = log, n
        self._own: Fold | None = None  # this version's fold, once the memo left it

    @property
    def version(self) -> int:
        """How many events changed this trace."""
        return self._n

    @property
    def nodes(self) -> Mapping[str, TraceNode]:
        """Vertices by id, in creation order."""
        return _Nodes(self._fold(pin=True).nodes)

    @property
    def edges(self) -> tuple[Edge, ...]:
        return tuple(map(Edge._make, self._fold(pin=True).edges))

    def children(self, node_id: str) -> list[str]:
        return [e[1] for e in self.edges if e[0] == node_id]

    def runs(self) -> list[TraceNode]:
        return [r for r in self.nodes.values() if r.kind == "run"]

    def executions(self, run_id: str | None = None) -> list[TraceNode]:
        return [r for r in self.nodes.values()
                if r.kind == "node" and (run_id is None or r.run_id == run_id)]

    def columns(self) -> tuple[list[TraceNode], list[BatchEvent]]:
        """(records, map batches): every vertex, batches left as columns for projections."""
        with self._log.lock:
            return self._fold().columns()

    def __eq__(self, other: object) -> bool:
        return self._content()[:2] == other._content()[:2] if isinstance(other, Trace) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # unhashable (compares by value); mypy wants a method

    def __len__(self) -> int:
        return len(self._fold(records=True).nodes)

    def __repr__(self) -> str:
        fold = self._fold()  # a repr never builds records
        return (f"Trace(version={self._n}, nodes={len(fold.nodes)}, edges={len(fold.edges)}, "
                f"map batches not folded yet={len(fold.batches)})")

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (*self._content(), self._n)

    def _content(self) -> tuple[list[tuple[str, str, str]], dict[str, Any], dict[Any, str]]:
        with self._log.lock:  # (edges, records, latest executions)
            fold = self._fold(records=True)
            return fold.edges[:], dict(fold.nodes), dict(fold.latest)

    def _extended(self, events: list[Any]) -> Trace:
        log, n = self._log, self._n
        with log.lock:
            if n == log.base.n + len(log.events):  # the newest version: append in place
                log.events.extend(events)
                return Trace(log, n + len(events))
            prefix = log.events[: n - log.base.n]
        return Trace(_Log(log.base, prefix + events), n + len(events))  # a new lineage

    def _fold(self, records: bool = False, pin: bool = False) -> Fold:
        """This version's fold: the memo moved forward to it, or its own; ``records``: with
        batches folded; ``pin``: records handed out, the fold never changes again."""
        log, n = self._log, self._n
        with log.lock:
            fold = self._own or log.memo
            if fold is None:
                fold = log.memo = log.base.copy()
            elif fold.n > n:  # the memo went past this version: it folds its own, once
                fold = self._own = log.base.copy()
            elif fold.pinned and fold.n < n:  # pinned by an older version
                fold = log.memo = fold.copy()
            fold.apply(log.events[fold.n - log.base.n: n - log.base.n])
            if records or pin:
                fold.fold_batches()
            if pin:
                fold.pinned, self._own = True, fold
            return fold


class _Nodes(Mapping[str, TraceNode]):
    def __init__(self, records: dict[str, tuple[Any, ...]]) -> None:
        self._records = records  # a pinned fold's

    def __getitem__(self, key: str) -> TraceNode:
        return TraceNode(*self._records[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)


def _restore(edges: list[tuple[str, str, str]], nodes: dict[str, tuple[Any, ...]],
             latest: dict[Any, str], version: int) -> Trace:
    return Trace(_Log(Fold(dict(nodes), list(edges), dict(latest), version), []), version)


def empty() -> Trace:
    """A trace with no events."""
    return _restore([], {}, {}, 0)


def reduce_event(trace: Trace, event: Event) -> Trace:
    """The trace with ``event`` applied; ``trace`` itself is never changed."""
    return reduce_events(trace, (event,))


def reduce_events(trace: Trace, events: Iterable[Event]) -> Trace:
    """``reduce_event`` over ``events`` in order, in one step (same result, less overhead)."""
    new = [kept(e) for e in events if e.run_id and handler(type(e)) is not None]
    return trace._extended(new) if new else trace  # others (state snapshots...) change nothing


class TraceCollector:
    """``Graph(nodes, callbacks=[TraceCollector()])``: ``collector.trace`` is then the trace of
    all it ran (maps on any engine included); events are reduced ``batch`` at a time."""

    def __init__(self, trace: Trace | None = None, batch: int = 4096) -> None:
        self._trace = trace if trace is not None else empty()
        self._pending: list[Event] = []
        self._batch, self._lock = batch, threading.Lock()

    @property
    def trace(self) -> Trace:
        with self._lock:
            if self._pending:
                self._trace, self._pending = reduce_events(self._trace, self._pending), []
            return self._trace

    def on_event(self, event: Event) -> None:
        self._pending.append(event)
        if len(self._pending) >= self._batch:
            self.trace  # noqa: B018 - reduce the buffer

    def on_batch(self, event: BatchEvent) -> None:
        """A map batch in columns: kept as columns (without its values) until read."""
        self._pending.append(kept(event))
