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

Persistence at O(1) per event: a trace is a *version* of a shared store (dicts + an edge
list). The newest version reads the store directly; reducing it updates the store in place
and records what it overwrote in an undo journal. An older version still alive (held by
someone) is rebuilt on first use from the store and the journal (Baker's trick), so it
never sees later events. The journal is dropped as soon as no older version is alive
(weak references tell), so the usual ``trace = reduce_event(trace, e)`` loop keeps no
history. One lineage is meant to be reduced by one thread at a time; a lock keeps two
threads reducing the same version from corrupting the store.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from .events import (
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

_ABSENT: Any = object()
_wrap = tuple.__new__
_OPEN = frozenset({"pending", "running", "interrupted"})


class Chunks(Sequence[Any]):
    """An immutable sequence of streamed chunks with O(1) amortised ``append``.

    Versions share one buffer while they only grow it (a version appends in place when it
    is the buffer's full length, and copies its prefix otherwise).
    """

    __slots__ = ("_buf", "_n")
    _lock = threading.Lock()

    def __init__(self, items: Iterable[Any] = ()) -> None:
        self._buf = list(items)
        self._n = len(self._buf)

    def append(self, chunk: Any) -> Chunks:
        new = Chunks.__new__(Chunks)
        with Chunks._lock:
            buf = self._buf
            if len(buf) != self._n:
                buf = buf[: self._n]
            buf.append(chunk)
        new._buf, new._n = buf, self._n + 1
        return new

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        return self._buf[: self._n][i] if isinstance(i, slice) else self._buf[range(self._n)[i]]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._buf[: self._n])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Chunks):
            return self._n == other._n and self._buf[: self._n] == other._buf[: other._n]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def joined(self) -> Any:
        """The chunks joined like a streaming node's value ("".join, b"".join, merged dicts)."""
        from .invoke import join_chunks

        return join_chunks(list(self))

    def __repr__(self) -> str:
        return f"Chunks({list(self)!r})"


_NO_CHUNKS = Chunks()


class TraceNode(NamedTuple):
    """One vertex of the trace: a node execution, a run, or a map call."""

    id: str
    kind: str  # "node" | "run" | "map"
    run_id: str = ""
    node_id: str = ""  # the graph node's name ("node" vertices)
    iteration: int = 0
    status: str = "pending"
    session_id: str = ""
    item_index: int | None = None
    parent_run_id: str | None = None
    node_type: str = ""
    step_index: int = -1
    started_at: float | None = None  # wall clock, seconds
    duration_ms: float | None = None
    cached: bool = False
    worker: str = ""
    attempts: int = 0
    error: str | None = None
    decision: Any = None
    chunks: Chunks | None = None  # streamed chunks (None: not a streaming execution)
    tags: tuple[str, ...] = ()
    items: int = 0  # map: item runs ended so far
    failed: int = 0  # map: item runs that ended in error

    @property
    def ended_at(self) -> float | None:
        if self.started_at is None or self.duration_ms is None:
            return None
        return self.started_at + self.duration_ms / 1000.0

    @property
    def retries(self) -> int:
        return max(0, self.attempts - 1)


class Edge(NamedTuple):
    src: str
    dst: str
    kind: str  # "seq" | "map" | "nested"


# ============================================================================ store


class _Store:
    """The mutable state behind the newest version of one lineage of traces."""

    __slots__ = ("nodes", "edges", "aux", "version", "journal", "jbase", "older", "deaths", "lock")

    def __init__(self, nodes: dict[str, Any], edges: list[Any], aux: dict[Any, Any],
                 version: int) -> None:
        self.nodes = nodes
        self.edges = edges
        self.aux = aux  # run -> its latest execution id; (run, node) -> that node's latest
        self.version = version
        self.journal: list[tuple[int, Any, Any]] = []  # (0 nodes | 1 aux, key, previous value)
        self.jbase = 0  # global position of journal[0]
        self.older = 0  # older versions still alive that may need the journal
        self.deaths: list[None] = []  # older versions that died since (appended lock-free)
        self.lock = threading.Lock()

    def put(self, key: str, node: tuple[Any, ...]) -> None:
        nodes = self.nodes
        self.journal.append((0, key, nodes.get(key, _ABSENT)))
        nodes[key] = node

    def set_aux(self, key: Any, value: Any) -> None:
        aux = self.aux
        self.journal.append((1, key, aux.get(key, _ABSENT)))
        aux[key] = value

    def put_many(self, records: dict[str, tuple[Any, ...]], edges: list[Any],
                 latest: dict[str, str]) -> None:
        """``put`` every record, append ``edges``, ``set_aux`` every run's latest execution."""
        nodes, aux = self.nodes, self.aux
        self.journal.extend([(0, k, nodes.get(k, _ABSENT)) for k in records])
        self.journal.extend([(1, k, aux.get(k, _ABSENT)) for k in latest])
        nodes.update(records)
        aux.update(latest)
        self.edges.extend(edges)
        records.clear()
        edges.clear()
        latest.clear()


class _Ref(weakref.ref):  # type: ignore[type-arg]
    """A superseded version's weak reference: its death releases the journal."""

    __slots__ = ("store", "counted")


def _released(ref: _Ref) -> None:
    # may run anywhere a reference is dropped (even under the lock): list.append is atomic
    if ref.counted:
        ref.counted = False
        ref.store.deaths.append(None)


class Trace:
    """An immutable execution trace (see the module docstring). Build it with ``reduce_event``."""

    __slots__ = ("_store", "_version", "_jpos", "_elen", "_ref", "__weakref__")

    def __init__(self, store: _Store, version: int, jpos: int, elen: int) -> None:
        self._store, self._version, self._jpos, self._elen = store, version, jpos, elen
        self._ref: _Ref | None = None

    # -- reading -----------------------------------------------------------------------
    @property
    def version(self) -> int:
        """How many events changed this trace."""
        return self._version

    @property
    def nodes(self) -> Mapping[str, TraceNode]:
        """Vertices by id, in creation order (a read-only view of this version)."""
        return _View(self, "nodes")

    @property
    def edges(self) -> Sequence[Edge]:
        """Edges in creation order (a read-only view of this version)."""
        return _EdgeView(self)

    def children(self, node_id: str) -> list[str]:
        return [e[1] for e in self._data().edges if e[0] == node_id]

    def of_kind(self, kind: str) -> list[TraceNode]:
        """Vertices of one kind ("node", "run", "map"), in creation order."""
        return [_wrap(TraceNode, r) for r in self._data().nodes.values() if r[1] == kind]

    def runs(self) -> list[TraceNode]:
        return self.of_kind("run")

    def executions(self, run_id: str | None = None) -> list[TraceNode]:
        found = self.of_kind("node")
        return found if run_id is None else [n for n in found if n.run_id == run_id]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        a, b = self._data(), other._data()
        return a.nodes == b.nodes and a.edges == b.edges

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self._data().nodes)

    def __repr__(self) -> str:
        d = self._data()
        return f"Trace(version={self._version}, nodes={len(d.nodes)}, edges={len(d.edges)})"

    def __reduce__(self) -> tuple[Any, ...]:
        d = self._data()
        return (_restore, (dict(d.nodes), list(d.edges), dict(d.aux), self._version))

    def __copy__(self) -> Trace:
        return self  # immutable

    def __deepcopy__(self, memo: Any) -> Trace:
        return self

    # -- versions ------------------------------------------------------------------------
    def _data(self) -> _Store:
        store = self._store
        return store if store.version == self._version else self._fork()

    def _fork(self) -> _Store:
        """Rebuild this (older) version as the head of a private store."""
        head = self._store
        with head.lock:
            if head.version == self._version:
                return head
            nodes, aux = dict(head.nodes), dict(head.aux)
            start = self._jpos - head.jbase
            if start < 0:  # unreachable: the journal is kept while this version is counted
                raise RuntimeError("internal error: trace history was released too early")
            for table, key, old in reversed(head.journal[start:]):
                d = nodes if table == 0 else aux
                if old is _ABSENT:
                    d.pop(key, None)
                else:
                    d[key] = old
            own = _Store(nodes, head.edges[: self._elen], aux, self._version)
            ref = self._ref
            if ref is not None and ref.counted:
                ref.counted = False
                head.older -= 1
            self._store, self._jpos, self._ref = own, 0, None
            return own


class _View(Mapping[str, TraceNode]):
    __slots__ = ("_trace", "_table")

    def __init__(self, trace: Trace, table: str) -> None:
        self._trace, self._table = trace, table

    def _d(self) -> dict[str, tuple[Any, ...]]:
        return getattr(self._trace._data(), self._table)  # type: ignore[no-any-return]

    def __getitem__(self, key: str) -> TraceNode:
        return _wrap(TraceNode, self._d()[key])

    def values(self) -> list[TraceNode]:  # type: ignore[override]
        return [_wrap(TraceNode, r) for r in self._d().values()]

    def __contains__(self, key: object) -> bool:
        return key in self._d()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._d()))

    def __len__(self) -> int:
        return len(self._d())

    def __repr__(self) -> str:
        return f"<trace nodes: {len(self)}>"


class _EdgeView(Sequence[Edge]):
    __slots__ = ("_trace",)

    def __init__(self, trace: Trace) -> None:
        self._trace = trace

    def __getitem__(self, i: Any) -> Any:
        found = self._trace._data().edges[i]
        return [_wrap(Edge, e) for e in found] if isinstance(i, slice) else _wrap(Edge, found)

    def __len__(self) -> int:
        return len(self._trace._data().edges)

    def __iter__(self) -> Iterator[Edge]:
        return iter([_wrap(Edge, e) for e in self._trace._data().edges])

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return f"<trace edges: {len(self)}>"


def _restore(nodes: dict[str, Any], edges: list[Any], aux: dict[Any, Any],
             version: int) -> Trace:
    return Trace(_Store(nodes, edges, aux, version), version, 0, len(edges))


def empty() -> Trace:
    """A trace with no events."""
    return _restore({}, [], {}, 0)


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
        store = trace._data()
        with store.lock:
            if store.version != trace._version or trace._store is not store:
                continue  # another thread advanced this version meanwhile: fork and retry
            deaths = store.deaths
            if deaths:
                k = len(deaths)
                del deaths[:k]
                store.older -= k
            if not store.older and store.journal:  # no older version alive: drop history
                store.jbase += len(store.journal)
                store.journal.clear()
            for handler, event in todo:
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
        """A map batch in columns: kept as is (a few columns), folded when ``trace`` is read."""
        self._pending.append(event)


# -- handlers (mutate the head store; only ever called by reduce_events) -------------------
# Records are stored as exact tuples laid out like ``TraceNode`` (the GC untracks exact
# tuples of atoms, not tuple subclasses: 10^5 tracked records make every collection slow);
# the read views wrap them in ``TraceNode``.

(_ID, _KIND, _RUN, _NODE, _ITER, _STATUS, _SESSION, _ITEM, _PARENT, _NODE_TYPE, _STEP,
 _STARTED, _DURATION, _CACHED, _WORKER, _ATTEMPTS, _ERROR, _DECISION, _CHUNKS, _TAGS, _ITEMS,
 _FAILED) = range(len(TraceNode._fields))
_DEFAULTS = tuple(TraceNode._field_defaults.get(f) for f in TraceNode._fields)


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


def _on_node_end(st: _Store, ev: NodeEndEvent) -> None:
    rec = list(_execution(st, ev, ev.iteration))
    started = ev.started_at or rec[_STARTED]
    if started is None:
        started = ev.timestamp - ev.duration_ms / 1000.0
    rec[_STATUS], rec[_CACHED], rec[_DURATION], rec[_STARTED] = (
        "complete", ev.cached, ev.duration_ms, started)
    rec[_WORKER] = ev.worker or rec[_WORKER]
    rec[_ATTEMPTS] = rec[_ATTEMPTS] or 1
    st.put(rec[_ID], tuple(rec))


def _on_node_error(st: _Store, ev: NodeErrorEvent) -> None:
    rec = list(_execution(st, ev, ev.iteration))
    started = ev.started_at or rec[_STARTED]
    if started is None:
        started = ev.timestamp - ev.duration_ms / 1000.0
    rec[_STATUS], rec[_ERROR], rec[_DURATION], rec[_STARTED] = (
        "error", _err(ev.error), ev.duration_ms, started)
    rec[_WORKER] = ev.worker or rec[_WORKER]
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


def _start_runs(st: _Store, ev: BatchEvent, runs: list[str]) -> None:
    session, parent, offset, started = ev.session_id, ev.parent_run_id, ev.offset, ev.started_at
    nodes = st.nodes
    records: dict[str, tuple[Any, ...]] = {}
    edges: list[Any] = []
    mid = ""
    for i, run_id in enumerate(runs):
        at = _At(run_id, "", session, offset + i, parent)
        if parent or run_id in nodes:  # nested runs, or a run seen before: the general case
            st.put_many(records, edges, {})
            rec = _ensure_run(st, at, "running", started)  # type: ignore[arg-type]
            if rec[_STATUS] == "pending":
                _update(st, rec, status="running", started_at=started)
            continue
        if not mid:
            mid = _map_id(at)  # type: ignore[arg-type]
            if mid not in nodes:
                st.put(mid, _record(id=mid, kind="map", session_id=session, status="running"))
        records[run_id] = (run_id, "run", run_id, "", 0, "running", session, offset + i, None,
                           "", -1, started) + _DEFAULTS[_DURATION:]
        edges.append((mid, run_id, "map"))
    st.put_many(records, edges, {})


def _fold_columns(st: _Store, ev: BatchEvent, part: NodeColumns, runs: list[str]) -> None:
    """One record per execution, created complete (a start and an end event in one step);
    an execution that already has a record (a nested run's placeholder) takes the events."""
    nodes, aux = st.nodes, st.aux
    session, parent, offset, worker = ev.session_id, ev.parent_run_id, ev.offset, ev.worker
    name, step, tags, cached = part.node_id, part.step_index, part.tags, part.cached
    node_type = "" if cached else part.node_type  # a hit has no start event
    times = list(ev.times(part))
    records: dict[str, tuple[Any, ...]] = {}
    edges: list[Any] = []
    latest: dict[str, str] = {}
    for k, i in enumerate(part.items):
        run_id = runs[i]
        tid = f"{run_id}:{name}:0"
        if tid in nodes or run_id not in nodes:
            st.put_many(records, edges, latest)  # keep the order of the events
            for event in ev.executions(part, times, (k,)):
                _handler(type(event))(st, event)
            continue
        started, ended = times[k]
        records[tid] = (tid, "node", run_id, name, 0, "complete", session, offset + i, parent,
                        node_type, step, started, (ended - started) * 1e3, cached, worker, 1,
                        None, None, None, tags, 0, 0)
        edges.append((aux.get(run_id, run_id), tid, "seq"))
        latest[run_id] = tid
    st.put_many(records, edges, latest)


def _end_runs(st: _Store, ev: BatchEvent, runs: list[str]) -> None:
    errors, offset, end, parent = ev.errors, ev.offset, ev.ended_at, ev.parent_run_id
    duration = (end - ev.started_at) * 1e3
    nodes = st.nodes
    records: dict[str, tuple[Any, ...]] = {}
    ended = failed = 0
    for i, run_id in enumerate(runs):
        old = nodes[run_id]
        error = errors.get(i)
        started = old[_STARTED]
        records[run_id] = old[:_STATUS] + (
            "error" if error else "complete",) + old[_STATUS + 1:_DURATION] + (
            duration or (None if started is None else (end - started) * 1e3),
        ) + old[_DURATION + 1:_ERROR] + (_err(error),) + old[_ERROR + 1:]
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
    from .trace_views import summary as _summary

    return _summary(trace)


def timeline(trace: Trace) -> Any:
    """Start/end of every execution, on lanes per worker."""
    from .trace_views import timeline as _timeline

    return _timeline(trace)


def dag(trace: Trace) -> Any:
    """The trace graph laid out with x (depth) and y (rank) for drawing."""
    from .trace_views import dag as _dag

    return _dag(trace)
