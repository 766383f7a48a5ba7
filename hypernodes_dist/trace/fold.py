"""What a trace is made of (``TraceNode`` vertices, ``Edge`` s, streamed ``Chunks``) and
the fold that builds them from logged events, in order."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from itertools import repeat, starmap
from operator import attrgetter, is_
from typing import Any, NamedTuple

from hypernodes_dist import events as E
from hypernodes_dist.events import hook_name
from hypernodes_dist.execution.invoke import join_chunks


@dataclass(slots=True)
class TraceNode:
    """One vertex of the trace: a node execution, a run, or a map call (a snapshot)."""
    id: str
    kind: str  # "node" | "run" | "map" | "batch" (a provider batch of batch_api nodes)
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
    waited_ms: float = 0.0  # slot, rate limit and retry back-off waits (PolicyEvents)
    error: str | None = None
    decision: Any = None
    chunks: Chunks | None = None  # streamed chunks (None: not a streaming execution)
    tags: tuple[str, ...] = ()
    items: int = 0  # map: item runs ended so far
    failed: int = 0  # map: item runs that ended in error
    usage: dict[str, float] | None = None  # what the execution metered (``meter``)

    @property
    def ended_at(self) -> float | None:
        if self.started_at is None or self.duration_ms is None:
            return None
        return self.started_at + self.duration_ms / 1000.0

    @property
    def retries(self) -> int:
        return max(0, self.attempts - 1)


values = attrgetter(*(f.name for f in fields(TraceNode)))  # a record's fields, as a tuple


class Edge(NamedTuple):
    src: str
    dst: str
    kind: str  # "seq" | "map" | "nested" | "batch" (a map to its provider batches)


class Chunks(list):
    """The chunks a streaming execution yielded, in order."""

    def joined(self) -> Any:
        """Joined like a stream's value (no chunks: ``[]``: the trace knows no stream kind)."""
        return join_chunks(list(self))


_OPEN = frozenset({"pending", "running", "interrupted"})


class Fold:
    """The records, edges and deferred map batches of the first ``n`` events of a log. Records
    are tuples of fields (the garbage collector skips those, not 10^5 objects); an event edits
    ``TraceNode`` s that ``commit`` stores back. Once ``pinned`` (read), a fold is copied."""
    __slots__ = ("nodes", "edges", "latest", "batches", "n", "work", "streams", "pinned")

    def __init__(self, nodes: dict[str, tuple[Any, ...]], edges: list[tuple[str, str, str]],
                 latest: dict[Any, str], n: int, batches: Sequence[E.BatchEvent] = ()) -> None:
        self.nodes, self.edges, self.n = nodes, edges, n
        self.latest = latest  # run -> its latest execution id; (run, node) -> that node's latest
        self.batches = list(batches)  # plain map batches not folded into records yet
        self.work: dict[str, TraceNode] = {}  # records the current event changes
        self.streams: set[str] = set()  # executions whose chunk list is this fold's own
        self.pinned = False

    def copy(self) -> Fold:
        return Fold(dict(self.nodes), list(self.edges), dict(self.latest), self.n, self.batches)

    def apply(self, entries: Sequence[Any]) -> None:  # ``kept`` events
        for entry in entries:
            if type(entry) is E.BatchEvent and _columnar(entry):
                self.batches.append(entry)  # stays columns until the records are read
            else:
                self.fold_batches()
                self._fold(entry)
        self.n += len(entries)

    def fold_batches(self) -> None:
        batches, self.batches = self.batches, []
        for event in batches:
            self._fold(event)

    def _fold(self, entry: Any) -> None:
        self._on_batch(entry) if type(entry) is E.BatchEvent else self._replay(entry)
        self.commit()

    def _replay(self, entry: Any) -> None:
        """An event, or a kept one (code, fields: the handlers read it like the event)."""
        make, fold = _REPLAY[entry[0]] if type(entry) is tuple else (None, handler(type(entry)))
        event = entry if make is None else make(entry[1])
        if fold is not None and event.run_id:
            fold(self, event)

    def columns(self) -> tuple[list[TraceNode], list[E.BatchEvent]]:
        """Records and deferred batches: every vertex (overlapping batches folded first)."""
        if self.batches and not _disjoint(self.batches, self.nodes):
            self.fold_batches()
        return list(starmap(TraceNode, self.nodes.values())), list(self.batches)

    def edit(self, tid: str) -> TraceNode:
        rec = self.work.get(tid)
        if rec is None:
            rec = self.work[tid] = TraceNode(*self.nodes[tid])
        return rec

    def put(self, rec: TraceNode) -> TraceNode:
        self.nodes[rec.id] = ()  # its place in creation order
        self.work[rec.id] = rec
        return rec

    def commit(self) -> None:
        work = self.work
        self.nodes.update(zip(work, map(values, work.values())))
        work.clear()

    def _run(self, run_id: str, session: str, item: int | None, parent: str | None,
             mid: str = "") -> TraceNode:
        """Run ``run_id``, created on first sight with its map (``mid``) or nesting edge."""
        if run_id in self.nodes:
            return self.edit(run_id)
        if parent and parent not in self.nodes:
            self.put(TraceNode(parent, "run", parent, session_id=session))
        elif not parent and item is not None:
            mid = mid or _map_id(run_id, item, session)
            if mid not in self.nodes:
                self.put(TraceNode(mid, "map", session_id=session, status="running"))
        rec = self.put(TraceNode(run_id, "run", run_id, "", 0, "pending", session, item, parent))
        if parent:
            self.edges.append((self._nesting(parent, run_id) or parent, run_id, "nested"))
        elif item is not None:
            self.edges.append((mid, run_id, "map"))
        return rec

    def _nesting(self, parent: str, run_id: str) -> str | None:
        """The execution an inner run ``{parent}/{node}-{call}.{index}`` belongs to: the
        node's latest in the parent run, or a pending placeholder until its events arrive."""
        name = run_id[len(parent) + 1:].rpartition("-")[0]
        if not run_id.startswith(parent + "/") or not name:
            return None
        cur = self.latest.get((parent, name)) or f"{parent}:{name}:0"
        if cur not in self.nodes:
            p = self.edit(parent)
            self._add(TraceNode(cur, "node", parent, name, session_id=p.session_id,
                                item_index=p.item_index, parent_run_id=p.parent_run_id))
        return cur

    def _add(self, rec: TraceNode) -> TraceNode:
        """A new execution record, with its sequential edge."""
        run_id, tid = rec.run_id, rec.id
        if run_id not in self.nodes:
            self._run(run_id, rec.session_id, rec.item_index, rec.parent_run_id)
        self.edges.append((self.latest.get(run_id, run_id), tid, "seq"))
        self.latest[run_id] = tid
        if rec.iteration:  # (run, node) -> its latest execution; absent: iteration 0 at most
            self.latest[(run_id, rec.node_id)] = tid
        return self.put(rec)

    def _execution(self, ev: Any, iteration: int | None = None) -> TraceNode:
        """The execution ``ev`` is about, created on first sight; without an ``iteration``
        (streaming, decisions, skips...) the node's open execution in that run, or the next."""
        run_id, name = ev.run_id, ev.node_id
        if iteration is None:
            cur = self.latest.get((run_id, name)) or f"{run_id}:{name}:0"
            rec = self.edit(cur) if cur in self.nodes else None
            if rec is not None and rec.status in _OPEN:
                return rec
            iteration = 0 if rec is None else rec.iteration + 1
        tid = f"{run_id}:{name}:{iteration}"
        if tid in self.nodes:
            return self.edit(tid)
        return self._add(TraceNode(tid, "node", run_id, name, iteration, session_id=ev.session_id,
                                   item_index=ev.item_index, parent_run_id=ev.parent_run_id,
                                   step_index=ev.step_index, tags=ev.tags))

    def _chunks(self, rec: TraceNode) -> Chunks:
        """``rec``'s chunk list, this fold's own (an older fold may share the one it had)."""
        if rec.id not in self.streams:
            rec.chunks = Chunks(rec.chunks or ())
            self.streams.add(rec.id)
        return rec.chunks  # type: ignore[return-value]  # set to this fold's Chunks just above

    def _on_node_start(self, ev: E.NodeStartEvent) -> None:
        rec = self._execution(ev, ev.iteration)
        # a re-start counts as an attempt; a new or placeholder (pending) record is this one
        rec.attempts = max(rec.attempts, 1) if rec.status == "pending" else rec.attempts + 1
        rec.status, rec.node_type, rec.step_index = "running", ev.node_type, ev.step_index
        rec.started_at = ev.timestamp

    def _on_node_end(self, ev: Any) -> None:  # a NodeEnd/NodeError event or its kept record
        rec = self._execution(ev, ev.iteration)
        started = ev.started_at or rec.started_at
        rec.started_at = ev.timestamp - ev.duration_ms / 1000.0 if started is None else started
        rec.duration_ms, rec.worker = ev.duration_ms, ev.worker or rec.worker
        if hasattr(ev, "error"):  # a node error
            rec.status, rec.error = "error", _err(ev.error)
            rec.attempts = max(rec.attempts, ev.attempts, 1)
        else:
            rec.status, rec.cached, rec.attempts = "complete", ev.cached, rec.attempts or 1
            rec.usage = ev.usage or None

    _on_node_error = _on_node_end  # an error ends its execution like a node end
    _on_streaming_end = _execution  # a stream's end only makes sure its execution exists

    def _on_node_skipped(self, ev: E.NodeSkippedEvent) -> None:
        rec = self._execution(ev)
        if rec.status == "pending":
            rec.status, rec.error = "skipped", ev.reason or None

    def _on_gate_decision(self, ev: E.GateDecisionEvent) -> None:
        self._execution(ev).decision = ev.decision

    def _on_streaming_start(self, ev: E.StreamingStartEvent) -> None:
        rec = self._execution(ev)
        rec.status = "running" if rec.status == "pending" else rec.status
        rec.started_at = rec.started_at or ev.timestamp
        self._chunks(rec)

    def _on_streaming_chunk(self, ev: E.StreamingChunkEvent) -> None:
        self._chunks(self._execution(ev)).append(ev.chunk)

    def _on_interrupt(self, ev: E.InterruptEvent) -> None:
        rec = self._execution(ev)
        rec.status, rec.node_type = "interrupted", "interrupt"
        rec.started_at = rec.started_at or ev.timestamp

    def _on_resume(self, ev: E.ResumeEvent) -> None:
        rec = self._execution(ev)
        rec.status, rec.node_type = "running", "interrupt"

    def _on_policy(self, ev: E.PolicyEvent) -> None:
        if ev.kind in ("retry", "throttle") and ev.node_id:  # a wait, not running time
            rec = self._execution(ev)
            rec.waited_ms += ev.wait * 1e3  # a retry: attempt ``ev.attempt`` failed
            rec.attempts = max(rec.attempts, ev.attempt + (ev.kind == "retry"))

    def _on_run_start(self, ev: E.RunStartEvent) -> None:
        rec = self._run(ev.run_id, ev.session_id, ev.item_index, ev.parent_run_id)
        if rec.status == "pending":
            rec.status, rec.started_at = "running", ev.timestamp

    def _on_run_end(self, ev: E.RunEndEvent) -> None:  # counted by its map while open
        item, parent = ev.item_index, ev.parent_run_id
        mid = _map_id(ev.run_id, item, ev.session_id) if item is not None and not parent else ""
        rec = self._run(ev.run_id, ev.session_id, item, parent, mid)
        if mid in self.nodes and rec.status in _OPEN:
            self._count(mid, 1, ev.status == "error")
        started, rec.status, rec.error = rec.started_at, ev.status, _err(ev.error)
        rec.duration_ms = ev.duration_ms or (
            None if started is None else (ev.timestamp - started) * 1e3)

    def _on_batch(self, ev: E.BatchEvent) -> None:
        """A map batch: new top-level runs in columns (the hot path: records built directly),
        any other batch (nested runs, policy events, runs seen before) as its ``expand()``."""
        runs = [f"{ev.run_id}{ev.offset + i}" for i in range(ev.n)]
        mid = _map_id(runs[0], ev.offset, ev.session_id) if runs and not ev.parent_run_id else ""
        if not (mid and _columnar(ev) and self.nodes.keys().isdisjoint(runs)):
            for event in ev.expand():
                self._replay(event)
            return
        self._fold_fresh(ev, runs, mid)

    def _fold_fresh(self, ev: E.BatchEvent, runs: list[str], mid: str) -> None:
        """A columnar batch of new top-level runs, records built directly (the hot path):
        each run ended, each execution complete (a start and an end in one step)."""
        nodes, edges, latest = self.nodes, self.edges, self.latest
        if mid not in nodes:
            self.put(TraceNode(mid, "map", session_id=ev.session_id, status="running"))
        session, offset, started, errors = ev.session_id, ev.offset, ev.started_at, ev.errors
        took = (ev.ended_at - started) * 1e3
        nodes.update((run_id, (
            run_id, "run", run_id, "", 0, "error" if i in errors else "complete", session,
            offset + i, None, "", -1, started, took, False, "", 0, 0.0, _err(errors.get(i)),
            None, None, (), 0, 0, None)) for i, run_id in enumerate(runs))
        edges.extend((mid, run_id, "map") for run_id in runs)
        self._count(mid, len(runs), len(errors))
        for part in ev.columns:
            name, step, tags, cached = part.node_id, part.step_index, part.tags, part.cached
            node_type = "" if cached else part.node_type  # a hit has no start event
            times = ev.times(part)
            usage = part.usage or repeat(None)
            for i, start, ms, used in zip(part.items, times[0], times[2], usage):
                run_id = runs[i]
                tid = f"{run_id}:{name}:0"
                nodes[tid] = (tid, "node", run_id, name, 0, "complete", session, offset + i,
                              None, node_type, step, start, ms, cached, ev.worker, 1, 0.0, None,
                              None, None, tags, 0, 0, used or None)  # values(TraceNode(...))
                edges.append((latest.get(run_id, run_id), tid, "seq"))
                latest[run_id] = tid

    def _on_batch_submitted(self, ev: Any) -> None:  # a provider batch (batch_api nodes)
        rec = self._provider_batch(ev)
        rec.status = "running" if rec.status == "pending" else rec.status

    def _on_batch_ended(self, ev: Any) -> None:
        rec = self._provider_batch(ev)
        rec.status, rec.error = ev.status, ev.reason or None
        rec.duration_ms = max(0.0, ev.ended_at - (rec.started_at or ev.ended_at)) * 1e3
        rec.items, rec.failed = ev.answered, ev.failed_lines

    def _provider_batch(self, ev: Any) -> TraceNode:
        """Batch ``ev.file`` of the map ``ev.run_id`` (a run-id prefix): a ``"batch"`` vertex
        (``node_id``: its node, ``worker``: the provider, ``items``/``failed``: its lines
        answered / failed, ``status``: running, done, cancelled, failed, lost) under its map."""
        tid = f"batch:{ev.file}"
        if tid in self.nodes:
            return self.edit(tid)
        mid = "map:" + ev.run_id.rstrip("-:_")
        if mid not in self.nodes:
            self.put(TraceNode(mid, "map", session_id=ev.session_id, status="running"))
        self.edges.append((mid, tid, "batch"))
        return self.put(TraceNode(tid, "batch", ev.run_id, ev.node_id, session_id=ev.session_id,
                                  node_type=ev.resource, started_at=ev.started_at,
                                  worker=ev.provider, usage={"lines": float(ev.lines)}))

    def _count(self, mid: str, ended: int, failed: int) -> None:
        m = self.edit(mid)  # map ``mid``: ``ended`` more of its item runs ended
        m.items, m.failed = m.items + ended, m.failed + failed
        m.status = "error" if m.failed else "complete"


def _map_id(run_id: str, item: int, session: str) -> str:
    """Items of one map share a run-id prefix (``{prefix}{item_index}``) and a session."""
    suffix = str(item)
    if run_id.endswith(suffix) and len(run_id) > len(suffix):
        return "map:" + run_id[: -len(suffix)].rstrip("-:_")
    return "map:" + session


def _err(err: Any) -> str | None:
    if err is None or isinstance(err, str):
        return err
    try:
        return f"{type(err).__name__}: {err}"
    except Exception:  # a broken __str__ never breaks tracing
        return type(err).__name__


def _columnar(ev: E.BatchEvent) -> bool:
    """A top-level batch of node executions only, each (node, item) once: read as columns."""
    if ev.parent_run_id or not ev.n or any(type(p) is not E.NodeColumns for p in ev.parts):
        return False
    items: dict[str, list[Any]] = {}
    for part in ev.columns:
        items.setdefault(part.node_id, []).append(part.items)
    return all(len(c) == 1 or sum(map(len, c)) == len(set().union(*c)) for c in items.values())


def _disjoint(batches: list[E.BatchEvent], nodes: Mapping[str, Any]) -> bool:
    """No two ``batches`` share a run, and no run of theirs has a record in ``nodes``."""
    spans = sorted((b.run_id, b.offset, b.offset + b.n) for b in batches)
    if any(p == q and start < end for (p, _, end), (q, start, _) in zip(spans, spans[1:])):
        return False
    return not nodes or not any(f"{b.run_id}{b.offset + i}" in nodes
                                for b in batches for i in range(b.n))


_VALUES = ("inputs", "outputs", "final_value", "value", "response_value", "state", "operations")
_SHAPES: dict[type, tuple[int, Callable[[Any], tuple[Any, ...]], bool]] = {}
_REPLAY: list[tuple[Callable[[Any], Any], Any]] = []  # code -> (event-like from fields, handler)


def kept(event: Any) -> Any:
    """``event`` as the log keeps it: (code, fields) without values (inputs...), errors as text."""
    if type(event) is tuple:
        return event  # kept already
    if type(event) is E.NodeColumns:
        return replace(event, outputs={}) if event.outputs else event
    if type(event) is E.BatchEvent:
        parts = [kept(p) for p in event.parts]
        if all(map(is_, parts, event.parts)) and all(type(e) is str for e in event.errors.values()):
            return event  # nothing to drop (already dropped by the collector)
        text: Any = {i: _err(e) for i, e in event.errors.items()}  # the log keeps errors as text
        return replace(event, parts=parts, errors=text)
    code, get, has_error = _SHAPES.get(type(event)) or _shape(type(event))
    found = get(event)
    return code, (*found[:-1], _err(found[-1])) if has_error else found


def _shape(cls: type) -> tuple[int, Callable[[Any], tuple[Any, ...]], bool]:
    names = sorted((f.name for f in fields(cls) if f.name not in _VALUES), key="error".__eq__)
    record: Any = namedtuple(cls.__name__, names)  # type: ignore[misc]  # names known at run time
    _REPLAY.append((record._make, handler(cls)))
    shape = _SHAPES[cls] = (len(_REPLAY) - 1, attrgetter(*names), names[-1] == "error")
    return shape  # (code, fields getter, whether the last field is an error)


_HANDLERS: dict[type, Callable[[Fold, Any], None] | None] = {}


def handler(cls: type) -> Callable[[Fold, Any], None] | None:
    """How an event of type ``cls`` is folded: ``Fold._on_<event>`` like a callback's hook
    (None: it does not change the trace)."""
    if cls not in _HANDLERS:
        _HANDLERS[cls] = next((found for c in cls.__mro__
                               if (found := getattr(Fold, f"_{hook_name(c)}", None))), None)
    return _HANDLERS[cls]
