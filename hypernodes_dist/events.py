"""Event dataclasses and callback dispatch.

Every event carries the run's ``session_id``/``run_id``, the ``node_id`` and ``step_index``
it concerns (empty/-1 for run-level events), the node's ``tags`` and a wall-clock
``timestamp``. A callback object receives ``on_<event>(event)`` (``on_node_end`` for
``NodeEndEvent``...) and/or ``on_event(event)``; a callback that raises is logged and
never breaks the run.

A map batch run by the columnar executor reports in columns: one ``BatchEvent`` per batch
instead of ~2 events per node execution (cheap to build, pickle and ship from workers).
A callback defining ``on_batch`` receives it as is; every other callback receives the
equivalent per-item events (``BatchEvent.expand()``), so ``on_node_end`` & co. see every
execution whatever the engine.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import add, mul, sub
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
    "ProgressEvent",
    "BatchSubmittedEvent",
    "BatchEndedEvent",
    "NodeColumns",
    "BatchEvent",
    "expanded",
    "GraphCallback",
    "hook_name",
    "wants_events",
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
    usage: dict[str, float] = field(default_factory=dict)  # what the call metered


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


@dataclass(kw_only=True)
class ProgressEvent(Event):
    """A map's progress, from the driver, to callbacks defining ``on_progress`` (only them:
    ``on_event`` does not receive it): at most 4 a second while rows finish, on every engine
    (counts come from where rows run), and one with ``final=True`` when the map ends. It may
    arrive in a thread of the driver that is not the caller's.

    ``done`` rows of ``total`` are finished (``resumed`` of them by an earlier run into the
    same ``into=``), ``failed`` and ``cache_hits`` among them; ``rate`` is this run's rows
    per second and ``eta`` the seconds left at that rate (``None`` until known); ``usage``
    is what this run metered so far (summed over nodes) and ``projected`` what it will have
    metered when every row is done at the same mean per row (absent once the map is done);
    ``stopped`` says what stopped the map (a budget, an error, an interrupt), or ``None``.
    A map with ``batch_api`` nodes adds its provider ``batches`` by state, its
    ``batch_lines`` (``done``, ``failed``, ``again``, ``online``) and ``saved``: the ``cost``
    its batch-answered calls metered (at the batch rate: what they saved), or ``None``."""

    done: int = 0
    total: int | None = None
    failed: int = 0
    cache_hits: int = 0
    resumed: int = 0
    rate: float | None = None
    eta: float | None = None
    usage: dict[str, float] = field(default_factory=dict)
    projected: dict[str, float] = field(default_factory=dict)
    stopped: str | None = None
    final: bool = False
    batches: dict[str, int] = field(default_factory=dict)  # provider batches by state
    batch_lines: dict[str, int] = field(default_factory=dict)  # done, failed, again, online
    saved: float | None = None  # ``cost`` saved by batch-answered calls (None: not metered)


@dataclass(kw_only=True)
class _ProviderBatch(Event):
    """A provider batch of a map's ``batch_api=True`` nodes (not a map ``BatchEvent``), from
    the driver: ``run_id`` is the map's run-id prefix, ``node_id`` the (first) batch node
    receiving ``resource``; ``file`` is the ledger's id of the file (unique per batch the
    map made), ``batch_id`` the provider's (empty: refused at create)."""

    file: str = ""
    batch_id: str = ""
    resource: str = ""
    provider: str = ""
    lines: int = 0
    started_at: float = 0.0  # wall clock: the create was sent


@dataclass(kw_only=True)
class BatchSubmittedEvent(_ProviderBatch):
    """The provider accepted a batch of ``lines`` requests (or a rerun found it running)."""


@dataclass(kw_only=True)
class BatchEndedEvent(_ProviderBatch):
    """A provider batch ended: ``status`` ``"done"`` (downloaded: ``answered`` lines with an
    answer, ``failed_lines`` of them answered with an error), ``"cancelled"`` (by the user or
    ``online_after``; downloaded alike), ``"failed"`` (as a whole: ``reason``, the provider's
    message; its lines go again while retries allow) or ``"lost"`` (404: the provider no
    longer knows it)."""

    status: str = "done"
    answered: int = 0
    failed_lines: int = 0
    ended_at: float = 0.0
    reason: str = ""


@dataclass
class NodeColumns:
    """The executions of one node over items of a batch, in columns (a ``BatchEvent`` part).

    ``items`` are batch positions; ``starts``/``ends`` are ``time.perf_counter()`` readings
    aligned with them (``None`` for cache hits: no time spent), turned into wall-clock
    seconds by adding the batch's ``clock``. ``outputs`` are the node's output columns over
    the whole batch (index them by position).
    """

    node_id: str
    step_index: int
    tags: tuple[str, ...]
    node_type: str
    cached: bool
    items: Sequence[int]
    starts: Sequence[float] | None
    ends: Sequence[float] | None
    outputs: Mapping[str, Sequence[Any]]
    usage: Sequence[dict[str, float] | None] | None = None  # per execution: what it metered


@dataclass(kw_only=True)
class BatchEvent(Event):
    """Items ``offset .. offset+n`` of a map batch: their runs, node executions (as
    ``NodeColumns``) and other events (errors, policies, nested runs) in arrival order.
    ``run_id`` is the map's run-id prefix; item ``i``'s run id is ``run_id + str(i)``."""

    offset: int = 0
    n: int = 0
    graph_id: str = ""
    started_at: float = 0.0  # wall clock: the batch's items run together, start to end
    ended_at: float = 0.0
    clock: float = 0.0  # wall clock minus perf_counter, for ``NodeColumns`` times
    errors: dict[int, BaseException] = field(default_factory=dict)  # position -> error
    worker: str = ""
    parts: list[NodeColumns | Event] = field(default_factory=list)

    @property
    def columns(self) -> list[NodeColumns]:
        """The node executions among ``parts`` (a plain batch holds nothing else)."""
        return [p for p in self.parts if isinstance(p, NodeColumns)]

    def expand(self) -> list[Event]:
        """The per-item events this batch stands for: run starts, executions, run ends."""
        session, prefix, offset = self.session_id, self.run_id, self.offset
        parent, start, end = self.parent_run_id, self.started_at, self.ended_at
        out: list[Event] = [
            RunStartEvent(session_id=session, run_id=f"{prefix}{offset + i}", item_index=offset + i,
                          parent_run_id=parent, graph_id=self.graph_id, timestamp=start)
            for i in range(self.n)
        ]
        for part in self.parts:
            if isinstance(part, NodeColumns):
                out.extend(self.executions(part))
            else:
                out.append(part)
        for i in range(self.n):
            error = self.errors.get(i)
            out.append(RunEndEvent(
                session_id=session, run_id=f"{prefix}{offset + i}", item_index=offset + i,
                parent_run_id=parent, status="error" if error else "complete", error=error,
                timestamp=end, duration_ms=(end - start) * 1e3))
        return out

    def executions(self, part: NodeColumns, which: Iterable[int] | None = None,
                   times: tuple[list[float], list[float], list[float]] | None = None,
                   ) -> Iterator[Event]:
        """Start (not for hits) and end events of ``part``'s executions number ``which``
        (default: all); ``times`` is ``self.times(part)`` when the caller has it."""
        session, prefix, offset, parent = self.session_id, self.run_id, self.offset, self.parent_run_id
        name, step, tags, items = part.node_id, part.step_index, part.tags, part.items
        starts, ends, durations = self.times(part) if times is None else times
        usage = part.usage or ()
        for k in range(len(items)) if which is None else which:
            i, started = items[k], starts[k]
            index, outputs = offset + i, {o: col[i] for o, col in part.outputs.items()}
            run_id = f"{prefix}{index}"
            if not part.cached:
                yield NodeStartEvent(session_id=session, run_id=run_id, node_id=name,
                                     step_index=step, tags=tags, item_index=index,
                                     parent_run_id=parent, node_type=part.node_type,
                                     timestamp=started)
            yield NodeEndEvent(
                session_id=session, run_id=run_id, node_id=name, step_index=step, tags=tags,
                item_index=index, parent_run_id=parent, timestamp=ends[k], outputs=outputs,
                cached=part.cached, duration_ms=durations[k], started_at=started,
                worker=self.worker, usage=dict(usage[k] or {}) if usage else {})

    def times(self, part: NodeColumns) -> tuple[list[float], list[float], list[float]]:
        """``wall_times`` and ``durations`` of ``part``'s executions."""
        return (*self.wall_times(part), self.durations(part))

    def wall_times(self, part: NodeColumns) -> tuple[list[float], list[float]]:
        """Wall-clock start and end of each execution of ``part`` (hits: the batch end)."""
        if part.starts is None or part.ends is None:
            return [self.ended_at] * len(part.items), [self.ended_at] * len(part.items)
        clock = self.clock
        return list(map(add, part.starts, repeat(clock))), list(map(add, part.ends, repeat(clock)))

    def durations(self, part: NodeColumns) -> list[float]:
        """Milliseconds each execution of ``part`` took (hits: 0.0), from the clock readings."""
        if part.starts is None or part.ends is None:
            return [0.0] * len(part.items)
        return list(map(mul, map(sub, part.ends, part.starts), repeat(1e3)))


def expanded(events: Iterable[Event]) -> Iterator[Event]:
    """``events`` with every ``BatchEvent`` replaced by its per-item events."""
    for event in events:
        if isinstance(event, BatchEvent):
            yield from event.expand()
        else:
            yield event


class GraphCallback:
    """Optional base class for callbacks; override the ``on_<event>`` methods you need."""

    @property
    def name(self) -> str:
        return type(self).__name__


_HOOKS: dict[type, str] = {}


def wants_events(callbacks: Sequence[Any]) -> bool:
    """Whether a callback takes run events (any ``on_*`` hook but ``on_progress``, which
    the driver feeds itself): only then do workers ship events with their batches."""
    return any(name.startswith("on_") and name != "on_progress"
               for cb in callbacks for name in dir(cb))


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
    event type (a map delivers 10^6 events). A raising callback is logged, never raised.
    A ``BatchEvent`` goes to the callbacks defining ``on_batch``; the others get its
    expansion (built once, however many callbacks want it)."""

    def __init__(self, callbacks: Sequence[Any]) -> None:
        self.callbacks = list(callbacks)
        self._routes: dict[type, list[tuple[Any, str, Any]]] = {}

    def _route(self, event_type: type) -> list[tuple[Any, str, Any]]:
        if issubclass(event_type, BatchEvent):
            takers = [cb for cb in self.callbacks if getattr(cb, "on_batch", None) is not None]
            others = [cb for cb in self.callbacks if cb not in takers]
            route = [(cb, "on_batch", cb.on_batch) for cb in takers]
            if others:
                per_item = Dispatcher(others)
                route.append((per_item, "all", lambda ev: per_item.all(ev.expand())))
        else:
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
