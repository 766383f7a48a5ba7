"""The value behind ``hypernodes_dist.trace``: an immutable ``Trace`` over a shared store.

Persistence at O(1) per event: a trace is a *version* of a shared store (dicts, an edge
list and the map batches not folded yet). The newest version reads the store directly;
reducing it updates the store in place and records what it overwrote in an undo journal.
An older version still alive (held by someone) is rebuilt on first use from the store and
the journal (Baker's trick), so it never sees later events. The journal is dropped as
soon as no older version is alive (weak references tell), so the usual
``trace = reduce_event(trace, e)`` loop keeps no history. One lineage is meant to be
reduced by one thread at a time; a lock keeps two threads reducing the same version from
corrupting the store.

Map batches are folded lazily: a ``BatchEvent`` whose executions can be read as columns
is kept as is (``_Store.defer``) and folded into records only when something reads the
records (``nodes``, ``edges``, ``==``, pickling, ``dag``) or an event that needs them
arrives. ``summary`` and ``timeline`` read such batches as columns (``Trace._columns``),
so a 10^5-item map is summarised without building 4 x 10^5 records.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["Trace", "TraceNode", "Edge", "Chunks", "empty"]

_ABSENT: Any = object()
_ALL_NEW: Any = object()  # a journal entry whose key is a tuple of keys that were all absent
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
        from hypernodes_dist.execution.invoke import join_chunks

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

    __slots__ = ("nodes", "edges", "aux", "pending", "version", "journal", "jbase", "older",
                 "deaths", "lock")

    def __init__(self, nodes: dict[str, Any], edges: list[Any], aux: dict[Any, Any],
                 version: int, pending: list[tuple[Any, Any]] | None = None) -> None:
        self.nodes = nodes
        self.edges = edges
        self.aux = aux  # run -> its latest execution id; (run, node) -> that node's latest
        self.pending = pending or []  # (handler, batch event) deferred, in arrival order
        self.version = version
        # (0 nodes | 1 aux, key, previous value) | (_DEFER, None, pending length before)
        # | (_FOLDED, None, the pending list folded)
        self.journal: list[tuple[int, Any, Any]] = []
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
                 latest: dict[str, str], new: bool = False) -> None:
        """``put`` every record, append ``edges``, ``set_aux`` every run's latest execution
        (``new``: the caller knows no record existed: one journal entry for all)."""
        nodes, aux = self.nodes, self.aux
        if new:
            if records:
                self.journal.append((0, tuple(records), _ALL_NEW))
        else:
            self.journal.extend([(0, k, nodes.get(k, _ABSENT)) for k in records])
        self.journal.extend([(1, k, aux.get(k, _ABSENT)) for k in latest])
        nodes.update(records)
        aux.update(latest)
        self.edges.extend(edges)
        records.clear()
        edges.clear()
        latest.clear()

    def defer(self, handler: Any, event: Any) -> None:
        """Keep a batch for a later ``handler(store, event)`` (see ``fold_pending``)."""
        self.journal.append((_DEFER, None, len(self.pending)))
        self.pending.append((handler, event))

    def fold_pending(self) -> None:
        """Fold the deferred batches into records: the same store as folding them at once."""
        pending = self.pending
        if pending:
            self.pending = []
            for handler, event in pending:
                handler(self, event)
            self.journal.append((_FOLDED, None, pending))

    def prune(self) -> None:
        """Drop the journal when no older version that may need it is alive."""
        deaths = self.deaths
        if deaths:
            k = len(deaths)
            del deaths[:k]
            self.older -= k
        if not self.older and self.journal:
            self.jbase += len(self.journal)
            self.journal.clear()

    def undo(self, entries: list[tuple[int, Any, Any]]) -> None:
        """Undo journal ``entries`` (newest last) on this private copy of a store."""
        nodes, aux = self.nodes, self.aux
        for table, key, old in reversed(entries):
            if table == _DEFER:
                del self.pending[old:]
            elif table == _FOLDED:
                self.pending = list(old)
            elif old is _ALL_NEW:
                d = nodes if table == 0 else aux
                for k in key:
                    del d[k]
            elif old is _ABSENT:
                (nodes if table == 0 else aux).pop(key, None)
            else:
                (nodes if table == 0 else aux)[key] = old


_DEFER, _FOLDED = 2, 3


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

    def _columns(self) -> tuple[list[tuple[Any, ...]], list[Any]]:
        """(records, batches) that together are this trace's executions: the records as
        stored (``TraceNode`` layout) and, after them, deferred batches to read as columns.
        Batches whose runs overlap each other or a record are folded first."""
        while True:
            store = self._data(fold=False)
            with store.lock:
                if store.version != self._version:
                    continue  # superseded meanwhile: this version is now a fork
                batches = [event for _handler, event in store.pending]
                if batches and not _disjoint(batches, store.nodes):
                    self._fold_here(store)
                    batches = []
                return list(store.nodes.values()), batches

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
        d = self._data(fold=False)  # a repr never builds records
        folded = f"Trace(version={self._version}, nodes={len(d.nodes)}, edges={len(d.edges)}"
        return folded + (f", map batches not folded yet={len(d.pending)})" if d.pending else ")")

    def __reduce__(self) -> tuple[Any, ...]:
        d = self._data()
        return (_restore, (dict(d.nodes), list(d.edges), dict(d.aux), self._version))

    def __copy__(self) -> Trace:
        return self  # immutable

    def __deepcopy__(self, memo: Any) -> Trace:
        return self

    # -- versions ------------------------------------------------------------------------
    def _data(self, fold: bool = True) -> _Store:
        """This version's store (deferred batches folded unless ``fold`` is False)."""
        while True:
            store = self._store
            if store.version != self._version:
                store = self._fork()
            if not (fold and store.pending):
                return store
            with store.lock:
                if store.version == self._version:
                    self._fold_here(store)
                    return store

    def _fold_here(self, store: _Store) -> None:
        """Fold ``store``'s deferred batches: the same content, so the same version, now
        anchored after the fold in the journal (undoing back to it keeps the records)."""
        store.fold_pending()
        self._jpos, self._elen = store.jbase + len(store.journal), len(store.edges)
        store.prune()

    def _fork(self) -> _Store:
        """Rebuild this (older) version as the head of a private store."""
        head = self._store
        with head.lock:
            if head.version == self._version:
                return head
            start = self._jpos - head.jbase
            if start < 0:  # unreachable: the journal is kept while this version is counted
                raise RuntimeError("internal error: trace history was released too early")
            own = _Store(dict(head.nodes), head.edges[: self._elen], dict(head.aux),
                         self._version, list(head.pending))
            own.undo(head.journal[start:])
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


def _disjoint(batches: list[Any], nodes: Mapping[str, Any]) -> bool:
    """No two ``batches`` share a run, and no run of theirs has a record in ``nodes``."""
    spans = sorted((b.run_id, b.offset, b.offset + b.n) for b in batches)
    for (prefix, _a, end), (nxt, start, _b) in zip(spans, spans[1:]):
        if prefix == nxt and start < end:
            return False
    return not nodes or not any(f"{b.run_id}{b.offset + i}" in nodes
                                for b in batches for i in range(b.n))


def _restore(nodes: dict[str, Any], edges: list[Any], aux: dict[Any, Any],
             version: int) -> Trace:
    return Trace(_Store(nodes, edges, aux, version), version, 0, len(edges))


def empty() -> Trace:
    """A trace with no events."""
    return _restore({}, [], {}, 0)



# Records are stored as exact tuples laid out like ``TraceNode`` (the GC untracks exact
# tuples of atoms, not tuple subclasses: 10^5 tracked records make every collection slow);
# the read views wrap them in ``TraceNode``.

(_ID, _KIND, _RUN, _NODE, _ITER, _STATUS, _SESSION, _ITEM, _PARENT, _NODE_TYPE, _STEP,
 _STARTED, _DURATION, _CACHED, _WORKER, _ATTEMPTS, _ERROR, _DECISION, _CHUNKS, _TAGS, _ITEMS,
 _FAILED) = range(len(TraceNode._fields))
_DEFAULTS = tuple(TraceNode._field_defaults.get(f) for f in TraceNode._fields)
