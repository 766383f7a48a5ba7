"""``TraceCollector``: a graph callback that folds every event it receives into a trace."""

from __future__ import annotations

import threading

from hypernodes_dist.events import BatchEvent, Event

from .fold import kept
from .log import Trace, empty, reduce_events

__all__ = ["TraceCollector"]


class TraceCollector:
    """``Graph(nodes, callbacks=[TraceCollector()])``; then ``collector.trace`` is the trace
    of everything the graph ran (``map`` items from any engine included). Events are
    reduced ``batch`` at a time, and whenever ``trace`` is read."""

    def __init__(self, trace: Trace | None = None, batch: int = 4096) -> None:
        self._trace = trace if trace is not None else empty()
        self._pending: list[Event] = []
        self._batch = batch
        self._lock = threading.Lock()

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
