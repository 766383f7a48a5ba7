"""Execution trace: a pure reducer from the events of any engine to an execution graph.

``reduce_event(trace, event) -> trace`` never changes ``trace``; reducing the same events
from ``empty()`` always gives an equal trace. The graph it builds has

- one ``TraceNode`` per node execution, id ``"{run_id}:{node_id}:{iteration}"``; one per run
  (id ``run_id``) and one per map call (id ``"map:{run prefix}"``);
- edges ``Edge(src, dst, kind)``: ``"seq"`` from a run to its first execution and from each
  execution to the next one of the same run (arrival order), ``"map"`` from a map to each
  item run, ``"nested"`` from the nesting execution (or, when the events do not tell which,
  the parent run) to each inner run (events with ``parent_run_id``);
- a status per execution derived from its lifecycle (``pending`` -> ``running`` ->
  ``complete`` | ``error`` | ``interrupted`` | ``skipped``), streaming chunks appended to
  the execution that produced them, gate decisions, attempts, worker and timing.

A plain map batch (``BatchEvent``: top-level runs, node columns only) is kept as columns
and its records are built when first read; ``summary`` and ``timeline`` read the columns.
The trace value and its persistence live in ``trace_store``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, NamedTuple

from hypernodes_dist.events import (
    BatchEvent,
    Event,
    GateDecisionEvent,
    InterruptEvent,
    NodeColumns,
    NodeEndEvent,
    NodeErrorEvent,
    NodeSkippedEvent,
    NodeStartEvent,
    PolicyEvent,
    ResumeEvent,
    RunEndEvent,
    RunStartEvent,
    StreamingChunkEvent,
    StreamingEndEvent,
    StreamingStartEvent,
)
from hypernodes_dist.trace_store import (
    _ABSENT,
    _ATTEMPTS,
    _CACHED,
    _CHUNKS,
    _DEFAULTS,
    _DURATION,
    _ERROR,
    _FAILED,
    _ID,
    _ITEM,
    _ITEMS,
    _ITER,
    _NO_CHUNKS,
    _NODE_TYPE,
    _OPEN,
    _PARENT,
    _SESSION,
    _STARTED,
    _STATUS,
    _STEP,
    _WORKER,
    Chunks,
    Edge,
    Trace,
    TraceNode,
    _Ref,
    _released,
    _Store,
    empty,
)

__all__ = [
    "Trace",
    "TraceNode",
    "Edge",
    "Chunks",
    "TraceCollector",
    "empty",
    "reduce_event",
    "reduce_events",
    "summary",
    "timeline",
    "dag",
]

# ============================================================================ reducer


def reduce_event(trace: Trace, event: Event) -> Trace:
    """The trace with ``event`` applied; ``trace`` itself is never changed."""
    return reduce_events(trace, (event,))


def reduce_events(trace: Trace, events: Iterable[Event]) -> Trace:
    """``reduce_event`` over ``events`` in order, in one step (same result, less overhead)."""
    todo = [(h, e) for e in events if e.run_id and (h := _handler(type(e))) is not None]
    if not todo:
        return trace  # events that do not change the graph (state snapshots/deltas...)
    while True:
        store = trace._data(fold=False)
        with store.lock:
            if store.version != trace._version or trace._store is not store:
                continue  # another thread advanced this version meanwhile: fork and retry
            store.prune()
            for handler, event in todo:
                if handler is _on_batch and _columnar(event):  # folded when records are read
                    store.defer(handler, _without_outputs(event))
                else:
                    store.fold_pending()
                    handler(store, event)
            store.version += len(todo)
            new = Trace(store, store.version, store.jbase + len(store.journal), len(store.edges))
            ref = _Ref(trace, _released)
            ref.store, ref.counted = store, True
            trace._ref = ref
            store.older += 1
            return new


class TraceCollector:
    """A callback that folds every event it receives into ``self.trace``.

    ``Graph(nodes, callbacks=[TraceCollector()])``; then ``collector.trace`` is the trace of
    everything the graph ran (``map`` items from any engine included). Events are buffered
    and folded ``batch`` at a time (and whenever ``trace`` is read).
    """

    def __init__(self, trace: Trace | None = None, batch: int = 4096) -> None:
        self._trace = trace if trace is not None else empty()
        self._pending: list[Event] = []
        self._batch = batch
        self._lock = threading.Lock()

    @property
    def trace(self) -> Trace:
        with self._lock:
            if self._pending:
                self._trace = reduce_events(self._trace, self._pending)
                self._pending = []
            return self._trace

    def on_event(self, event: Event) -> None:
        pending = self._pending
        pending.append(event)
        if len(pending) >= self._batch:
            self.trace  # noqa: B018 - fold the buffer

    def on_batch(self, event: BatchEvent) -> None:
        """A map batch in columns: kept (without its values), reduced when ``trace`` is read."""
        self._pending.append(_without_outputs(event))


# -- handlers (mutate the head store; only ever called by reduce_events) -------------------


def _record(**fields: Any) -> tuple[Any, ...]:
    return tuple(TraceNode("", "")._replace(**fields))


def _ensure_run(st: _Store, ev: Event, status: str = "pending",
                started: float | None = None) -> tuple[Any, ...]:
    run_id = ev.run_id
    rec = st.nodes.get(run_id)
    if rec is not None:
        return rec
    rec = (run_id, "run", run_id, "", 0, status, ev.session_id, ev.item_index,
           ev.parent_run_id, "", -1, started) + _DEFAULTS[_DURATION:]
    parent = ev.parent_run_id
    if parent:
        if parent not in st.nodes:
            st.put(parent, _record(id=parent, kind="run", run_id=parent,
                                   session_id=ev.session_id))
        st.put(run_id, rec)
        src = _nesting_execution(st, parent, run_id) or parent
        st.edges.append((src, run_id, "nested"))
    elif ev.item_index is not None:
        mid = _map_id(ev)
        if mid not in st.nodes:
            st.put(mid, _record(id=mid, kind="map", session_id=ev.session_id, status="running"))
        st.put(run_id, rec)
        st.edges.append((mid, run_id, "map"))
    else:
        st.put(run_id, rec)
    return rec


class _At(NamedTuple):
    """Where a record goes (an event-like for ``_blank``/``_create``/``_ensure_run``)."""

    run_id: str
    node_id: str
    session_id: str
    item_index: int | None
    parent_run_id: str | None
    step_index: int = -1
    tags: tuple[str, ...] = ()


def _nesting_execution(st: _Store, parent: str, run_id: str) -> str | None:
    """The parent execution an inner run belongs to (inner run ids read
    ``{parent_run_id}/{node}-{call}.{index}``): the node's latest execution in the parent run, a
    pending placeholder when its own events have not arrived yet (columnar executors emit
    them after the call), so the edge does not depend on arrival order."""
    if not run_id.startswith(parent + "/"):
        return None
    name = run_id[len(parent) + 1:].rpartition("-")[0]
    if not name:
        return None
    cur = st.aux.get((parent, name)) or f"{parent}:{name}:0"
    if cur not in st.nodes:
        prec = st.nodes[parent]
        at = _At(parent, name, prec[_SESSION], prec[_ITEM], prec[_PARENT])
        _create(st, at, _blank(at, cur, 0))  # type: ignore[arg-type]
    return cur


def _map_id(ev: Event) -> str:
    """Items of one map share a run-id prefix (``{prefix}{item_index}``) and a session."""
    suffix = str(ev.item_index)
    rid = ev.run_id
    if rid.endswith(suffix) and len(rid) > len(suffix):
        return "map:" + rid[: -len(suffix)].rstrip("-:_")
    return "map:" + ev.session_id


def _create(st: _Store, ev: Event, rec: tuple[Any, ...]) -> None:
    """Add a new execution record with its sequential edge."""
    run_id, tid = ev.run_id, rec[_ID]
    if run_id not in st.nodes:
        _ensure_run(st, ev)
    st.put(tid, rec)
    aux = st.aux
    st.edges.append((aux.get(run_id, run_id), tid, "seq"))
    st.set_aux(run_id, tid)  # run -> its latest execution
    if rec[_ITER]:  # (run, node) -> its latest execution; absent: iteration 0 at most
        st.set_aux((run_id, ev.node_id), tid)


def _blank(ev: Event, tid: str, iteration: int) -> tuple[Any, ...]:
    return (tid, "node", ev.run_id, ev.node_id, iteration, "pending", ev.session_id,
            ev.item_index, ev.parent_run_id, "", ev.step_index, None, None, False, "", 0, None,
            None, None, ev.tags, 0, 0)


def _execution(st: _Store, ev: Event, iteration: int | None) -> tuple[Any, ...]:
    """The execution ``ev`` is about; created (with its edges) on first sight.

    Events without an iteration (streaming, decisions, interrupts, skips) belong to the
    node's open execution in that run, or to the next one.
    """
    run_id, name = ev.run_id, ev.node_id
    nodes = st.nodes
    if iteration is None:
        cur = st.aux.get((run_id, name)) or f"{run_id}:{name}:0"
        rec = nodes.get(cur)
        if rec is None:
            iteration = 0
        elif rec[_STATUS] in _OPEN:
            return rec
        else:
            iteration = rec[_ITER] + 1
    tid = f"{run_id}:{name}:{iteration}"
    rec = nodes.get(tid)
    if rec is None:
        rec = _blank(ev, tid, iteration)
        _create(st, ev, rec)
    return rec


def _err(err: BaseException | None) -> str | None:
    if err is None:
        return None
    try:
        return f"{type(err).__name__}: {err}"
    except Exception:  # a broken __str__ never breaks tracing
        return type(err).__name__


def _update(st: _Store, rec: tuple[Any, ...], **changes: Any) -> None:
    new = list(rec)
    for name, value in changes.items():
        new[_INDEX[name]] = value
    st.put(rec[_ID], tuple(new))


_INDEX = {f: i for i, f in enumerate(TraceNode._fields)}


def _on_node_start(st: _Store, ev: NodeStartEvent) -> None:
    iteration = ev.iteration
    tid = f"{ev.run_id}:{ev.node_id}:{iteration}"
    old = st.nodes.get(tid)
    if old is None:  # the usual case: create it running, in one step
        _create(st, ev, (tid, "node", ev.run_id, ev.node_id, iteration, "running",
                         ev.session_id, ev.item_index, ev.parent_run_id, ev.node_type,
                         ev.step_index, ev.timestamp, None, False, "", 1, None, None, None,
                         ev.tags, 0, 0))
        return
    rec = list(old)
    # a re-start counts as an attempt; a placeholder (pending) is this very attempt
    attempts = rec[_ATTEMPTS] + 1 if rec[_STATUS] != "pending" else max(rec[_ATTEMPTS], 1)
    rec[_STATUS], rec[_NODE_TYPE], rec[_STEP] = "running", ev.node_type, ev.step_index
    rec[_STARTED], rec[_ATTEMPTS] = ev.timestamp, attempts
    st.put(tid, tuple(rec))


def _ended(st: _Store, ev: NodeEndEvent | NodeErrorEvent, status: str) -> list[Any]:
    """The execution ``ev`` ends, with its status, start, duration and worker set."""
    rec = list(_execution(st, ev, ev.iteration))
    started = ev.started_at or rec[_STARTED]
    if started is None:
        started = ev.timestamp - ev.duration_ms / 1000.0
    rec[_STATUS], rec[_DURATION], rec[_STARTED] = status, ev.duration_ms, started
    rec[_WORKER] = ev.worker or rec[_WORKER]
    return rec


def _on_node_end(st: _Store, ev: NodeEndEvent) -> None:
    rec = _ended(st, ev, "complete")
    rec[_CACHED] = ev.cached
    rec[_ATTEMPTS] = rec[_ATTEMPTS] or 1
    st.put(rec[_ID], tuple(rec))


def _on_node_error(st: _Store, ev: NodeErrorEvent) -> None:
    rec = _ended(st, ev, "error")
    rec[_ERROR] = _err(ev.error)
    rec[_ATTEMPTS] = max(rec[_ATTEMPTS], ev.attempts, 1)
    st.put(rec[_ID], tuple(rec))


def _on_skipped(st: _Store, ev: NodeSkippedEvent) -> None:
    rec = _execution(st, ev, None)
    if rec[_STATUS] == "pending":
        _update(st, rec, status="skipped", error=ev.reason or None)


def _on_decision(st: _Store, ev: GateDecisionEvent) -> None:
    _update(st, _execution(st, ev, None), decision=ev.decision)


def _on_stream_start(st: _Store, ev: StreamingStartEvent) -> None:
    rec = _execution(st, ev, None)
    status = "running" if rec[_STATUS] == "pending" else rec[_STATUS]
    _update(st, rec, status=status, started_at=rec[_STARTED] or ev.timestamp,
            chunks=rec[_CHUNKS] or _NO_CHUNKS)


def _on_chunk(st: _Store, ev: StreamingChunkEvent) -> None:
    rec = _execution(st, ev, None)
    _update(st, rec, chunks=(rec[_CHUNKS] or _NO_CHUNKS).append(ev.chunk))


def _on_stream_end(st: _Store, ev: StreamingEndEvent) -> None:
    _execution(st, ev, None)


def _on_interrupt(st: _Store, ev: InterruptEvent) -> None:
    rec = _execution(st, ev, None)
    _update(st, rec, status="interrupted", node_type="interrupt",
            started_at=rec[_STARTED] or ev.timestamp)


def _on_resume(st: _Store, ev: ResumeEvent) -> None:
    _update(st, _execution(st, ev, None), status="running", node_type="interrupt")


def _on_policy(st: _Store, ev: PolicyEvent) -> None:
    if ev.kind == "retry" and ev.node_id:  # attempt ``ev.attempt`` failed; another follows
        rec = _execution(st, ev, None)
        if rec[_ATTEMPTS] < ev.attempt + 1:
            _update(st, rec, attempts=ev.attempt + 1)


def _on_run_start(st: _Store, ev: RunStartEvent) -> None:
    rec = _ensure_run(st, ev, "running", ev.timestamp)
    if rec[_STATUS] == "pending":
        _update(st, rec, status="running", started_at=ev.timestamp)


def _on_run_end(st: _Store, ev: RunEndEvent) -> None:
    old = _ensure_run(st, ev)
    rec = list(old)
    started = rec[_STARTED]
    rec[_STATUS], rec[_ERROR] = ev.status, _err(ev.error)
    rec[_DURATION] = ev.duration_ms or (None if started is None else (ev.timestamp - started) * 1e3)
    st.put(rec[_ID], tuple(rec))
    if ev.item_index is not None and not ev.parent_run_id and old[_STATUS] in _OPEN:
        mid = _map_id(ev)
        m = list(st.nodes[mid])
        m[_ITEMS] += 1
        m[_FAILED] += ev.status == "error"
        m[_STATUS] = "error" if m[_FAILED] else "complete"
        st.put(mid, tuple(m))


def _on_batch(st: _Store, ev: BatchEvent) -> None:
    """A map batch in columns: the same trace as its ``expand()``, without the events."""
    runs = [f"{ev.run_id}{ev.offset + i}" for i in range(ev.n)]
    _start_runs(st, ev, runs)
    for part in ev.parts:
        if isinstance(part, NodeColumns):
            _fold_columns(st, ev, part, runs)
        elif part.run_id and (handler := _handler(type(part))) is not None:
            handler(st, part)
    if ev.n:
        _end_runs(st, ev, runs)


def _columnar(ev: BatchEvent) -> bool:
    """Can ``ev`` be read as columns: a top-level batch of node executions only, each
    (node, item) once."""
    if ev.parent_run_id or not ev.n:
        return False
    seen: dict[str, Any] = {}
    for part in ev.parts:
        if type(part) is not NodeColumns:
            return False
        if part.node_id in seen:
            items = seen[part.node_id]
            if not isinstance(items, set):
                items = seen[part.node_id] = set(items)
            if not items.isdisjoint(part.items):
                return False
            items.update(part.items)
        else:
            seen[part.node_id] = part.items
    return True


def _without_outputs(ev: BatchEvent) -> BatchEvent:
    """``ev`` without its output columns: a trace keeps no values (nor keeps them alive)."""
    if not any(type(part) is NodeColumns and part.outputs for part in ev.parts):
        return ev  # nothing to drop (already dropped by the collector)
    return replace(ev, parts=[replace(part, outputs={}) if type(part) is NodeColumns else part
                              for part in ev.parts])


def _start_runs(st: _Store, ev: BatchEvent, runs: list[str]) -> None:
    session, parent, offset, started = ev.session_id, ev.parent_run_id, ev.offset, ev.started_at
    nodes = st.nodes
    records: dict[str, tuple[Any, ...]] = {}
    edges: list[Any] = []
    mid = ""
    for i, run_id in enumerate(runs):
        if parent or run_id in nodes:  # nested runs, or a run seen before: the general case
            st.put_many(records, edges, {}, new=True)
            at = _At(run_id, "", session, offset + i, parent)
            rec = _ensure_run(st, at, "running", started)  # type: ignore[arg-type]
            if rec[_STATUS] == "pending":
                _update(st, rec, status="running", started_at=started)
            continue
        if not mid:
            mid = _map_id(_At(run_id, "", session, offset + i, parent))  # type: ignore[arg-type]
            if mid not in nodes:
                st.put(mid, _record(id=mid, kind="map", session_id=session, status="running"))
        records[run_id] = (run_id, "run", run_id, "", 0, "running", session, offset + i, None,
                           "", -1, started) + _DEFAULTS[_DURATION:]
        edges.append((mid, run_id, "map"))
    st.put_many(records, edges, {}, new=True)


def _fold_columns(st: _Store, ev: BatchEvent, part: NodeColumns, runs: list[str]) -> None:
    """One record per execution, created complete (a start and an end event in one step);
    an execution that already has a record (a nested run's placeholder) takes the events."""
    nodes, aux = st.nodes, st.aux
    session, parent, offset, worker = ev.session_id, ev.parent_run_id, ev.offset, ev.worker
    name, step, tags, cached = part.node_id, part.step_index, part.tags, part.cached
    node_type = "" if cached else part.node_type  # a hit has no start event
    records: dict[str, tuple[Any, ...]] = {}
    edges: list[Any] = []
    latest: dict[str, str] = {}
    times = ev.times(part)
    for k, (i, started, duration) in enumerate(zip(part.items, times[0], times[2])):
        run_id = runs[i]  # every run of the batch has its record (``_start_runs``)
        tid = f"{run_id}:{name}:0"
        if tid in nodes:
            st.put_many(records, edges, latest, new=True)  # keep the order of the events
            for event in ev.executions(part, (k,), times):
                _handler(type(event))(st, event)
            continue
        records[tid] = (tid, "node", run_id, name, 0, "complete", session, offset + i, parent,
                        node_type, step, started, duration, cached, worker, 1,
                        None, None, None, tags, 0, 0)
        edges.append((aux.get(run_id, run_id), tid, "seq"))
        latest[run_id] = tid
    st.put_many(records, edges, latest, new=True)


def _end_runs(st: _Store, ev: BatchEvent, runs: list[str]) -> None:
    errors, offset, end, parent = ev.errors, ev.offset, ev.ended_at, ev.parent_run_id
    duration = (end - ev.started_at) * 1e3
    nodes = st.nodes
    records: dict[str, tuple[Any, ...]] = {}
    ended = failed = 0
    for i, run_id in enumerate(runs):
        old = nodes[run_id]
        error = errors.get(i) if errors else None
        rec = list(old)
        rec[_STATUS], rec[_ERROR] = ("error" if error else "complete"), _err(error)
        started = old[_STARTED]
        rec[_DURATION] = duration or (None if started is None else (end - started) * 1e3)
        records[run_id] = tuple(rec)
        if old[_STATUS] in _OPEN:
            ended += 1
            failed += error is not None
    st.put_many(records, [], {})
    if ended and not parent:
        mid = _map_id(_At(runs[0], "", ev.session_id, offset, parent))  # type: ignore[arg-type]
        m = list(nodes[mid])
        m[_ITEMS] += ended
        m[_FAILED] += failed
        m[_STATUS] = "error" if m[_FAILED] else "complete"
        st.put(mid, tuple(m))


_HANDLERS: dict[type, Any] = {
    NodeStartEvent: _on_node_start,
    NodeEndEvent: _on_node_end,
    NodeErrorEvent: _on_node_error,
    NodeSkippedEvent: _on_skipped,
    GateDecisionEvent: _on_decision,
    StreamingStartEvent: _on_stream_start,
    StreamingChunkEvent: _on_chunk,
    StreamingEndEvent: _on_stream_end,
    InterruptEvent: _on_interrupt,
    ResumeEvent: _on_resume,
    PolicyEvent: _on_policy,
    RunStartEvent: _on_run_start,
    RunEndEvent: _on_run_end,
    BatchEvent: _on_batch,
}


def _handler(cls: type) -> Any:
    found = _HANDLERS.get(cls, _ABSENT)
    if found is _ABSENT:
        found = next((_HANDLERS[c] for c in cls.__mro__ if c in _HANDLERS), None)
        _HANDLERS[cls] = found
    return found


# ============================================================================ projections


def summary(trace: Trace) -> dict[str, Any]:
    """Per graph node: executions, cache hits, errors, retries, p50/p95/max duration."""
    from hypernodes_dist.trace_views import summary as _summary

    return _summary(trace)


def timeline(trace: Trace) -> Any:
    """Start/end of every execution, on lanes per worker."""
    from hypernodes_dist.trace_views import timeline as _timeline

    return _timeline(trace)


def dag(trace: Trace) -> Any:
    """The trace graph laid out with x (depth) and y (rank) for drawing."""
    from hypernodes_dist.trace_views import dag as _dag

    return _dag(trace)
