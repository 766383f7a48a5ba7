"""``BatchState``: one batch's executor state, explicit, and what both strategies do to it.

The columnar strategy (``columnar.py``) and the item flow (``flow.py``) are two ways of
driving the same state — as dask's ``get_async`` drives one state dict — through plain
functions: ``calls.py`` calls a node over items, ``batchkeys.py`` keys them, and this module
stores what a node produced (values, codes, branch decisions, failures), gathers what the
calls metered (the one usage path) and builds the batch's ``ColumnarResult``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypernodes_dist.cache.keys import Keys, WriteBuffer
from hypernodes_dist.errors import WaitingForBatch, annotate, portable
from hypernodes_dist.events import BatchEvent, Event, NodeColumns, NodeErrorEvent
from hypernodes_dist.execution.batchwait import LINK
from hypernodes_dist.execution.cacheview import CacheView
from hypernodes_dist.execution.clock import Clock
from hypernodes_dist.execution.context import worker_id
from hypernodes_dist.execution.guard import Guard
from hypernodes_dist.execution.invoke import split_outputs
from hypernodes_dist.execution.job import HIT, RAN, BatchSettings, Chunk, ColumnarResult, TimedSpan
from hypernodes_dist.execution.progress import Ticker, ticker
from hypernodes_dist.execution.scheduler import decision_target
from hypernodes_dist.missing import MISSING
from hypernodes_dist.nodes import END, HyperNode
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.usage import NodeTotal, Usage, add_usage

__all__ = ["BatchState", "new_state", "Record", "record_failure", "store", "src_column",
           "harvest", "usage_of", "build_result", "advance"]

# the strategy's hook for the executions ``store`` kept (events only): (state, node, items, code)
Record = Callable[["BatchState", HyperNode, Sequence[int], int], None]


@dataclass(eq=False, slots=True)
class BatchState:
    """Everything one batch's execution reads and writes; see the module docstring."""

    plan: Plan
    chunk: Chunk
    settings: BatchSettings
    writes: WriteBuffer | None  # the caller flushes it (``keys.batch_writes``)
    view: CacheView
    keys: Keys | None
    n: int
    values: dict[str, list[Any]]  # value columns: mapped inputs, then outputs
    consts: dict[str, Any]  # broadcast inputs
    codes: dict[str, bytearray]  # node -> item -> NOT_RUN / RAN / HIT
    active: dict[str, set[int]]  # branch/gate target -> the items that chose it
    wanted: set[str]
    record: Record | None = None
    failed: dict[int, BaseException] = field(default_factory=dict)  # waiting items too
    waiting: set[int] = field(default_factory=set)  # items waiting for a provider batch
    ended: set[int] = field(default_factory=set)  # items a gate ENDed
    node_keys: dict[str, list[str]] = field(default_factory=dict)
    src_keys: dict[str, list[str | None]] = field(default_factory=dict)  # output -> its run's key
    input_ids: dict[str, list[str] | str] = field(default_factory=dict)
    events: list[NodeColumns | Event] = field(default_factory=list)  # parts of the BatchEvent
    timing: dict[str, tuple[Sequence[int], Clock]] = field(default_factory=dict)
    times: dict[str, tuple[Sequence[int], list[TimedSpan]]] = field(default_factory=dict)
    guards: dict[str, Guard] = field(default_factory=dict)  # the nodes being called
    usage: dict[str, dict[int, Usage]] = field(default_factory=dict)  # node -> item -> metered
    calls: dict[str, int] = field(default_factory=dict)  # batch nodes: calls made
    need: dict[str, Sequence[int]] | None = None  # columnar: set by the demand pass
    looked_up: set[str] = field(default_factory=set)  # nodes whose hits were fetched
    started: float = 0.0  # wall clock
    clock: float = 0.0  # wall clock = perf_counter + clock
    ticks: Ticker | None = None  # the progress channel's ticker (None: no channel)
    stage: tuple[int, int] = (0, 1)  # columnar: the node being called (its place, its calls)
    metered: Usage = field(default_factory=dict)  # progress channel: what guarded calls metered


def new_state(plan: Plan, chunk: Chunk, settings: BatchSettings,
              writes: WriteBuffer | None) -> BatchState:
    """A fresh state for ``chunk``: its columns copied, nothing run."""
    cache = settings.cache
    now = time.time()
    LINK.set(settings.batch)  # the item flow's tasks copy it (run_batch resets it)
    return BatchState(
        plan, chunk, settings, writes, CacheView(cache, writes),
        Keys(plan, cache) if cache is not None else None, chunk.n,
        {k: list(v) for k, v in chunk.columns.items()}, dict(chunk.broadcast),
        {node.name: bytearray(chunk.n) for node in plan.nodes},
        {t: set() for t in plan.gated}, set(settings.select or plan.outputs),
        started=now, clock=now - time.perf_counter(),
        ticks=ticker(settings.progress) if settings.progress is not None else None)


def advance(st: BatchState, calls: int) -> None:
    """``calls`` of the current node's calls are done: the batch's rows count as done in
    proportion to the nodes behind them (the progress channel; no-op without it)."""
    if st.ticks is not None:
        k, total = st.stage
        done = st.n * (k * total + calls) // (len(st.plan.nodes) * total)
        st.ticks.tick(st.chunk.offset, done, st.metered)


# -- storing what ran ------------------------------------------------------------------
# what a waiting item keeps in ``failed``: one shared marker, not its own exception (a
# million rows' exceptions made the collector's full passes run through the record pass)
WAITING = WaitingForBatch()


def record_failure(st: BatchState, node: HyperNode, i: int, exc: BaseException) -> None:
    """Item ``i`` failed in ``node``: annotated, raised (``on_error="raise"``) or kept. An
    item waiting for a provider batch (``WaitingForBatch``) is kept apart: not an error, no
    event; it runs no further node (``failed`` holds it too, until ``build_result``)."""
    settings = st.settings
    if isinstance(exc, WaitingForBatch):
        # its traceback dropped (the call's frames, and a cycle through the frame that
        # raised it); the item keeps the shared marker, not an object a row
        exc.with_traceback(None)
        st.failed[i] = WAITING
        st.waiting.add(i)
        return
    index = settings.item(st.chunk.offset + i)
    annotate(exc, node.name, index)
    if settings.on_error == "raise":
        raise exc
    st.failed[i] = portable(exc)
    if settings.want_events:
        st.events.append(NodeErrorEvent(
            session_id=settings.session_id, run_id=settings.run_id(index),
            node_id=node.name, tags=node.tags, item_index=index, error=st.failed[i],
            attempts=getattr(exc, "hn_attempts", 1),
        ))


def store(st: BatchState, node: HyperNode, results: dict[int, Any], code: int) -> None:
    """Keep ``results`` (item -> value) of ``node`` as ``code`` (RAN or HIT)."""
    if node.targets:
        results = _decide(st, node, results)
    codes = st.codes[node.name]
    outputs = node.outputs
    cols = [st.values.setdefault(o, [MISSING] * st.n) for o in outputs]
    node_keys = st.node_keys.get(node.name)
    srcs = [src_column(st, o) for o in outputs]
    single = len(outputs) == 1
    for i, value in results.items():
        if single:
            cols[0][i] = value
        elif outputs:
            try:
                parts = split_outputs(node, value)
            except Exception as exc:
                record_failure(st, node, i, exc)
                continue
            for col, part in zip(cols, parts):
                col[i] = part
        for src in srcs:
            src[i] = node_keys[i] if node_keys is not None else None
        codes[i] = code
    if st.settings.want_events and st.record is not None:
        failed = st.failed
        st.record(st, node, [i for i in results if i not in failed], code)


def src_column(st: BatchState, output: str) -> list[str | None]:
    """``output``'s column of producing keys, writable (never a node's own key list)."""
    src = st.src_keys.get(output)
    if src is None:
        src = st.src_keys[output] = [None] * st.n
    elif len(st.plan.producers[output]) == 1 and src is st.node_keys.get(
            st.plan.producers[output][0]):
        # src is a list here; mypy narrows it to the type of the right side of ``is``
        src = st.src_keys[output] = list(src)  # type: ignore[arg-type]  # src is a list here; mypy narrows it to the right side of ``is``
    return src


def _decide(st: BatchState, node: HyperNode, results: dict[int, Any]) -> dict[int, Any]:
    """Activate each item's chosen target; a bad decision fails that item."""
    decided = {}
    for i, value in results.items():
        try:
            target = decision_target(node, value)
        except Exception as exc:
            record_failure(st, node, i, exc)
            continue
        if target is END:
            st.ended.add(i)
        else:
            st.active[target].add(i)
        decided[i] = value
    return decided


# -- usage: the one path ----------------------------------------------------------------
def harvest(st: BatchState, node: HyperNode, total: NodeTotal) -> None:
    """Move what ``node``'s guard metered per item, and what its calls metered outside a
    guarded call (``total``: the node's, not an item's), into ``st.usage``."""
    guard = st.guards.pop(node.name, None)
    kept = st.usage.setdefault(node.name, {})
    if guard is not None:
        offset = st.chunk.offset
        for item, usage in guard.usage.items():
            kept[-1 if item is None else item - offset] = usage
        guard.usage = {}
        if node.batch_size is not None:
            st.calls[node.name] = st.calls.get(node.name, 0) + guard.calls
    if total.usage:
        add_usage(kept.setdefault(-1, {}), total.usage)
    if not kept:
        del st.usage[node.name]


def usage_of(st: BatchState, name: str, items: Sequence[int]) -> list[Usage | None] | None:
    """What each of ``items`` metered in its call of ``name`` (``None``: nothing)."""
    kept = st.usage.get(name)
    return None if not kept else [kept.get(i) for i in items]


# -- the result ------------------------------------------------------------------------
def build_result(st: BatchState) -> ColumnarResult:
    """The batch's ``ColumnarResult`` (and its ``BatchEvent`` when events are wanted)."""
    wanted, n = st.settings.select or st.plan.outputs, st.n
    outputs = {k: st.values.get(k, [MISSING] * n) for k in wanted}
    if st.failed:  # copies: the batch event's columns keep what each node produced
        outputs = {k: list(col) for k, col in outputs.items()}
        for i in st.failed:
            for col in outputs.values():
                col[i] = MISSING
    errors = {i: e for i, e in st.failed.items() if i not in st.waiting}
    ran = {name: c.count(RAN) for name, c in st.codes.items()}
    times = dict(st.times)
    for name, (positions, clock) in st.timing.items():
        times[name] = (positions, [TimedSpan(0, len(positions), 0.0, 0.0, clock)])
    result = ColumnarResult(
        st.chunk.offset, n, outputs, errors, executed=sum(ran.values()),
        hits=sum(c.count(HIT) for c in st.codes.values()), worker=worker_id(),
        run_prefix=st.settings.run_prefix, usage=st.usage,
        calls={name: st.calls.get(name, count) for name, count in ran.items()},
        order=tuple(node.name for node in st.plan.nodes), codes=st.codes, times=times,
        clock=st.clock, started=st.started,
        node_outputs={node.name: node.outputs for node in st.plan.nodes},
        waiting=sorted(st.waiting))
    if st.settings.want_events:
        result.events = [_batch_event(st)]
    return result


def _batch_event(st: BatchState) -> BatchEvent:
    s = st.settings
    return BatchEvent(
        session_id=s.session_id, run_id=s.run_prefix, offset=st.chunk.offset, n=st.n,
        graph_id=st.plan.graph_hash, started_at=st.started, ended_at=time.time(),
        clock=st.clock, worker=worker_id(), parts=st.events,
        errors={i: e for i, e in st.failed.items() if i not in st.waiting})
