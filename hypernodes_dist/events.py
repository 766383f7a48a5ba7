"""Event dataclasses and callback dispatch.

Every event carries the run's ``session_id``/``run_id``, the ``node_id`` and ``step_index``
it concerns (empty/-1 for run-level events), the node's ``tags`` and a wall-clock
``timestamp``. A callback object receives ``on_<event>(event)`` (``on_node_end`` for
``NodeEndEvent``...) and/or ``on_event(event)``; a callback that raises is logged and
never breaks the run.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Event",
    "RunStartEvent",
    "RunEndEvent",
    "NodeStartEvent",
    "NodeEndEvent",
    "NodeErrorEvent",
    "NodeSkippedEvent",
    "GateDecisionEvent",
    "InterruptEvent",
    "ResumeEvent",
    "StateSnapshotEvent",
    "StateDeltaEvent",
    "StreamingStartEvent",
    "StreamingChunkEvent",
    "StreamingEndEvent",
    "PolicyEvent",
    "GraphCallback",
    "hook_name",
    "Dispatcher",
]

log = logging.getLogger("hypernodes_dist.events")


@dataclass(kw_only=True)
class Event:
    """Fields shared by every event."""

    session_id: str = ""
    run_id: str = ""
    node_id: str = ""
    step_index: int = -1
    tags: tuple[str, ...] = ()
    timestamp: float = field(default_factory=time.time)
    parent_run_id: str | None = None
    item_index: int | None = None


@dataclass(kw_only=True)
class RunStartEvent(Event):
    inputs: dict[str, Any] = field(default_factory=dict)
    graph_id: str = ""


@dataclass(kw_only=True)
class RunEndEvent(Event):
    status: str = "complete"
    outputs: dict[str, Any] = field(default_factory=dict)
    duration_ms: float = 0.0
    error: BaseException | None = None


@dataclass(kw_only=True)
class NodeStartEvent(Event):
    inputs: dict[str, Any] = field(default_factory=dict)
    node_type: str = "function"
    iteration: int = 0
    parallel_index: int = 0


@dataclass(kw_only=True)
class NodeEndEvent(Event):
    outputs: dict[str, Any] = field(default_factory=dict)
    duration_ms: float = 0.0
    cached: bool = False
    iteration: int = 0
    parallel_index: int = 0
    started_at: float = 0.0
    worker: str = ""


@dataclass(kw_only=True)
class NodeErrorEvent(Event):
    error: BaseException | None = None
    duration_ms: float = 0.0
    iteration: int = 0
    attempts: int = 1
    started_at: float = 0.0
    worker: str = ""


@dataclass(kw_only=True)
class NodeSkippedEvent(Event):
    reason: str = ""
    skipped_by: str | None = None


@dataclass(kw_only=True)
class GateDecisionEvent(Event):
    gate_id: str = ""
    decision: Any = None
    activated_targets: tuple[str, ...] = ()


@dataclass(kw_only=True)
class InterruptEvent(Event):
    interrupt_name: str = ""
    checkpoint_id: str | None = None
    value: Any = None


@dataclass(kw_only=True)
class ResumeEvent(Event):
    interrupt_name: str = ""
    response_value: Any = None


@dataclass(kw_only=True)
class StateSnapshotEvent(Event):
    state: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class StateDeltaEvent(Event):
    operations: list[dict[str, Any]] = field(default_factory=list)


@dataclass(kw_only=True)
class StreamingStartEvent(Event):
    output_name: str = ""


@dataclass(kw_only=True)
class StreamingChunkEvent(Event):
    output_name: str = ""
    chunk: Any = None
    chunk_index: int = 0


@dataclass(kw_only=True)
class StreamingEndEvent(Event):
    output_name: str = ""
    final_value: Any = None


@dataclass(kw_only=True)
class PolicyEvent(Event):
    """A node policy acted on one call: ``kind`` is ``"retry"`` (attempt ``attempt`` failed;
    the next starts after ``wait`` s), ``"throttle"`` (waited ``wait`` s for a concurrency
    slot or a rate-limit turn) or ``"timeout"`` (attempt ``attempt`` ran out of ``wait`` s)."""

    kind: str = ""
    attempt: int = 1
    wait: float = 0.0
    reason: str = ""


class GraphCallback:
    """Optional base class for callbacks; override the ``on_<event>`` methods you need."""

    @property
    def name(self) -> str:
        return type(self).__name__


_HOOKS: dict[type, str] = {}


def hook_name(event_type: type) -> str:
    """``NodeEndEvent`` -> ``"on_node_end"``."""
    name = _HOOKS.get(event_type)
    if name is None:
        base = event_type.__name__.removesuffix("Event")
        name = "on_" + re.sub(r"(?<!^)(?=[A-Z])", "_", base).lower()
        _HOOKS[event_type] = name
    return name


class Dispatcher:
    """Delivers events to callbacks; each callback's hook methods are looked up once per
    event type (a map delivers 10^6 events). A raising callback is logged, never raised."""

    def __init__(self, callbacks: Sequence[Any]) -> None:
        self.callbacks = list(callbacks)
        self._routes: dict[type, list[tuple[Any, str, Any]]] = {}

    def _route(self, event_type: type) -> list[tuple[Any, str, Any]]:
        hook = hook_name(event_type)
        route = [
            (cb, name, method)
            for cb in self.callbacks
            for name in (hook, "on_event")
            if (method := getattr(cb, name, None)) is not None
        ]
        self._routes[event_type] = route
        return route

    def __call__(self, event: Event) -> None:
        route = self._routes.get(type(event))
        if route is None:
            route = self._route(type(event))
        for cb, name, method in route:
            try:
                method(event)
            except Exception:
                log.warning(
                    "callback %s.%s raised; the run goes on", type(cb).__name__, name,
                    exc_info=True,
                )

    def all(self, events: Iterable[Event]) -> None:
        """Deliver each event in order."""
        if self.callbacks:
            for event in events:
                self(event)
