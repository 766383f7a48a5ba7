"""Calling one node over a column of items: the calling half of the columnar strategy.

Sync nodes run as one C-level ``map`` over the argument columns, each call timed at C
level (``Clock``) and handed to the cache in slices; async nodes run as one ``gather``
(at most ``settings.concurrency`` calls in flight). A node's ``Policy`` wraps its calls
through a ``Guard``. Plain functions over the batch's ``BatchState`` (``state.py``): they
read its columns and settings and write its timings, guards and failures, and report
progress (``state.advance``) after each slice or call. Without events a sync node's calls
are timed in spans (one clock reading per span); a node whose first calls are slow
(``SLOW_CALL``) gets a per-call clock for the rest, so map items' history shows real times
at no cost on trivial nodes. With a cache or a progress channel, sync calls run in slices
that adapt to the call time.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import weakref
from array import array
from collections.abc import Callable, Iterator, Sequence
from itertools import islice, repeat
from typing import Any

from hypernodes_dist.cache.keys import FLUSH_SECONDS
from hypernodes_dist.execution.batching import call_column
from hypernodes_dist.execution.clock import Clock
from hypernodes_dist.execution.context import PARENT, Parent
from hypernodes_dist.execution.guard import Guard, timed_call
from hypernodes_dist.execution.invoke import join_chunks
from hypernodes_dist.execution.job import TimedSpan
from hypernodes_dist.execution.state import BatchState, advance, harvest, record_failure
from hypernodes_dist.missing import MISSING
from hypernodes_dist.nodes import HyperNode
from hypernodes_dist.policies.usage import NODE, add_usage, node_total

__all__ = ["call", "guard_for", "parent_of", "PERSIST_SLICE", "Persist", "positional"]

PERSIST_SLICE = 64  # at most this many cacheable sync calls between two hand-overs
PROGRESS_SLICE = 4096  # without a cache, at most this many calls between progress reports
# the slice size a node reached in its last batch (slices still halve as soon as one is slow)
_SLICES: weakref.WeakKeyDictionary[HyperNode, int] = weakref.WeakKeyDictionary()
Persist = Callable[[Sequence[int], Sequence[Any]], None]


def _args(st: BatchState, node: HyperNode, todo: Sequence[int]) -> list[Iterator[Any]]:
    full = len(todo) == st.n
    count = len(todo)
    its = []
    for p in node.params:
        if p in st.values:
            col = st.values[p]
            if p in node.defaults and p in st.plan.producers:  # absent -> default
                default = node.defaults[p]
                col = [default if v is MISSING else v for v in col]
            its.append(iter(col) if full else iter([col[i] for i in todo]))
        elif p in st.consts:
            its.append(repeat(st.consts[p], count))
        else:
            its.append(repeat(node.defaults[p], count))
    if not its:
        its.append(repeat(None, count))
    return its


async def call(st: BatchState, node: HyperNode, todo: Sequence[int],
               persist: Persist | None) -> list[Any]:
    """``node``'s calls over ``todo``; what they ``meter`` is kept per item (``usage``)."""
    if not todo:
        return []
    total = node_total(node.name)  # what unguarded calls meter (``policies/usage.py``)
    token = NODE.set(total)
    try:
        return await _call_column(st, node, todo, persist)
    finally:
        NODE.reset(token)
        harvest(st, node, total)


async def _call_column(st: BatchState, node: HyperNode, todo: Sequence[int],
                       persist: Persist | None) -> list[Any]:
    if node.batch_size is not None:
        return await _call_batches(st, node, todo, persist)
    fn = positional(node)
    guard = guard_for(st, node) if node.guarded else None  # policies.py
    if node.is_async or (node.streaming and not node.is_generator):
        return await _call_async(st, node, todo, guard, persist)
    if guard is not None:
        fn = guard.positional(fn, [st.chunk.offset + i for i in todo])
    clock = None
    if st.settings.want_events:
        clock = Clock()
        st.timing[node.name] = (todo, clock)
    if node.nests:  # inner runs are children of the item's run (events, cache, session)
        fn, clock = _nesting(st, fn, todo, clock), None
    spans: list[TimedSpan] | None = None
    if clock is None:  # no per-call clock: spans of calls timed together (``_per_call``)
        spans = []
        st.times[node.name] = (todo, spans)
    its = _args(st, node, todo)
    out: list[Any] = []
    if persist is None and st.ticks is None:
        if spans is not None and len(todo) > PROBE:
            _map(st, node, fn, [islice(it, PROBE) for it in its], todo, out, None, spans)
            clock = _per_call(spans, len(out))
        _map(st, node, fn, its, todo, out, clock, spans)
        _close(spans, len(out))
        return out
    # persist (and report progress) as slices finish; slices adapt to the call time
    cap = PERSIST_SLICE if persist is not None else PROGRESS_SLICE
    start, size = 0, min(_SLICES.get(node, 1), cap)
    while start < len(todo):
        stop = min(start + size, len(todo))
        t0 = time.monotonic()
        try:
            _map(st, node, fn, [islice(it, stop - start) for it in its], todo, out, clock,
                      spans)
        finally:  # even on Ctrl-C: what finished in this slice is kept
            if persist is not None:
                persist(todo[start:len(out)], out[start:])
            advance(st, len(out))
        if start == 0 and spans is not None:
            clock = _per_call(spans, len(out))
        quick = time.monotonic() - t0 < FLUSH_SECONDS / 4
        size = min(size * 2, cap) if quick else max(1, size // 2)
        start = stop
    _close(spans, len(out))
    _SLICES[node] = size
    return out

async def _call_batches(st: BatchState, node: HyperNode, todo: Sequence[int],
                        persist: Persist | None) -> list[Any]:
    """A batch node's calls over ``todo`` (``batching.py``); failures recorded per item,
    results handed to the cache after each call."""
    guard = guard_for(st, node) if node.guarded else None
    n = len(todo)
    out: list[Any] = [MISSING] * n
    clock = Clock()
    clock.starts, clock.ends = array("d", bytes(8 * n)), array("d", bytes(8 * n))
    called = 0

    def on_call(positions: Sequence[int], values: list[Any], start: float,
                end: float) -> None:
        nonlocal called
        if type(positions) is range and not _has_error(values):  # whole slices
            a, b = positions.start, positions.stop
            out[a:b] = values
            clock.starts[a:b] = array("d", (start,)) * (b - a)
            clock.ends[a:b] = array("d", (end,)) * (b - a)
        else:
            for k, value in zip(positions, values):
                if isinstance(value, Exception):
                    record_failure(st, node, todo[k], value)
                else:
                    out[k] = value
                clock.starts[k], clock.ends[k] = start, end
        if persist is not None:
            persist([todo[k] for k in positions], [out[k] for k in positions])
        called += len(positions)
        advance(st, called)

    st.timing[node.name] = (todo, clock)
    node_keys = st.node_keys.get(node.name)
    keys = None if node_keys is None else [node_keys[i] for i in todo]
    await call_column(node, todo, _args(st, node, todo), guard, st.chunk.offset,
                      st.settings.concurrency, on_call, keys, st.settings.run_prefix)
    return out

def _map(st: BatchState, node: HyperNode, fn: Callable[..., Any], its: list[Iterator[Any]],
         todo: Sequence[int], out: list[Any], clock: Clock | None = None,
         spans: list[TimedSpan] | None = None) -> list[Any]:
    """Call ``fn`` over the argument iterators into ``out``; a failing call marks its item
    and the loop resumes after it (C-level ``map``: no per-item Python overhead). Without
    a ``clock``, the calls are timed together as one span appended to ``spans``."""
    first, t0 = len(out), time.perf_counter()
    while True:
        try:
            if clock is None:
                out.extend(map(fn, *its))
            else:
                clock.run(fn, its, out)
            break
        except Exception as exc:
            record_failure(st, node, todo[len(out)], exc)
            out.append(MISSING)
    if spans is not None and clock is None and len(out) > first:
        spans.append(TimedSpan(first, len(out), t0, time.perf_counter()))
    return out

async def _call_async(st: BatchState, node: HyperNode, todo: Sequence[int], guard: Any = None,
                      persist: Persist | None = None) -> list[Any]:
    its = _args(st, node, todo)
    limit = st.settings.concurrency or len(todo)
    plain = (guard is None and persist is None and not st.settings.want_events
             and not node.nests and st.ticks is None)
    if plain and node.is_async and not node.streaming and len(todo) <= limit:
        t0 = time.perf_counter()
        results = await asyncio.gather(*map(positional(node), *its), return_exceptions=True)
        st.times[node.name] = (todo, [TimedSpan(0, len(todo), t0, time.perf_counter())])
        return _gathered(st, node, todo, results)
    sem = asyncio.Semaphore(limit)
    params = node.params
    called = 0

    async def one(args: tuple[Any, ...], i: int) -> Any:
        nonlocal called
        if node.nests:  # this task's own context
            PARENT.set(parent_of(st, i))
        async with sem:
            kwargs = dict(zip(params, args)) if params else {}
            value, t0 = await timed_call(node, kwargs, guard, st.chunk.offset + i)
            if persist is not None:
                persist((i,), (value,))
            called += 1
            advance(st, called)
            return value, t0, time.perf_counter()

    results = await asyncio.gather(
        *(one(a if params else (), i) for a, i in zip(zip(*its), todo)), return_exceptions=True
    )
    clock = Clock()
    clock.add(*zip(*[(0.0, 0.0) if isinstance(r, BaseException) else r[1:] for r in results]))
    st.timing[node.name] = (todo, clock)
    return _gathered(st, node, todo, [
        r if isinstance(r, BaseException) else r[0] for r in results])

def _gathered(st: BatchState, node: HyperNode, todo: Sequence[int], results: list[Any]) -> list[Any]:
    """``gather`` results -> values, failures recorded per item (MISSING in their place)."""
    out = []
    for i, r in zip(todo, results):
        if isinstance(r, BaseException):
            if not isinstance(r, Exception):
                raise r
            record_failure(st, node, i, r)
            out.append(MISSING)
        else:
            out.append(r)
    return out

def _nesting(st: BatchState, fn: Callable[..., Any], todo: Sequence[int],
             clock: Clock | None) -> Callable[..., Any]:
    """``fn`` (timed into ``clock`` when given) with each call's inner runs as children
    of the item's run: they report to this batch's events and share its cache."""
    positions = iter(todo)
    now = time.perf_counter

    def nesting(*args: Any) -> Any:
        token = PARENT.set(parent_of(st, next(positions)))
        start = now()
        try:
            return fn(*args)
        finally:
            if clock is not None:
                clock.add((start,), (now(),))
            PARENT.reset(token)

    return nesting


def parent_of(st: BatchState, i: int) -> Parent:
    """Item ``i``'s run as the parent of a nested graph's runs (events, session, cache)."""
    s = st.settings
    emit = st.events.append if s.want_events else None
    return Parent(emit, s.session_id, s.run_id(st.chunk.offset + i), s.cache)


def guard_for(st: BatchState, node: HyperNode) -> Guard:
    """The node's call policy for this batch; ``PolicyEvent``s join the batch's events."""
    report = None
    if st.settings.want_events:
        s, events = st.settings, st.events

        def report(event: Any) -> None:
            event.session_id, event.run_id = s.session_id, s.run_id(event.item_index)
            event.step_index = st.plan.position[node.name]
            events.append(event)

    guard = st.guards[node.name] = Guard(node, report, st.settings.budget, st.consts)
    if st.ticks is not None:  # the progress channel carries what calls meter
        metered = st.metered
        guard.on_usage = lambda usage: add_usage(metered, usage)
    return guard


def _has_error(values: list[Any]) -> bool:
    """Whether a batch call's values hold an ``Exception`` (its types read at C speed)."""
    return any(issubclass(t, Exception) for t in set(map(type, values)))


PROBE = 8  # calls timed together before deciding whether a node's calls are timed one by one
SLOW_CALL = 20e-6  # from this call time on, a per-call clock reading costs < 2%


def _per_call(spans: list[TimedSpan], at: int) -> Clock | None:
    """A ``Clock`` for the calls after ``at`` when the first span shows slow calls (their
    history then has each call's own time), else ``None`` (trivial calls keep the C-level
    ``map`` with no reading per call; their history has their span's average)."""
    if not spans:
        return None
    first, last, t0, t1, _ = spans[-1]
    if (t1 - t0) / (last - first) < SLOW_CALL:
        return None
    clock = Clock()
    spans.append(TimedSpan(at, at, 0.0, 0.0, clock))
    return clock


def _close(spans: list[TimedSpan] | None, end: int) -> None:
    """The per-call segment (if any) covers the calls up to ``end``."""
    if spans and spans[-1].clock is not None:
        spans[-1] = spans[-1]._replace(last=end)


_POSITIONAL: weakref.WeakKeyDictionary[HyperNode, Callable[..., Any]] = weakref.WeakKeyDictionary()


def positional(node: HyperNode) -> Callable[..., Any]:
    """A callable taking the node's parameters positionally, streams joined (memoised)."""
    found = _POSITIONAL.get(node)
    if found is None:
        found = _POSITIONAL[node] = _make_positional(node)
    return found


def _make_positional(node: HyperNode) -> Callable[..., Any]:
    fn = node.func
    assert fn is not None
    params = node.params
    try:
        kinds = {p.kind for p in inspect.signature(fn).parameters.values()}
    except (TypeError, ValueError):
        kinds = set()
    func = fn
    if not params:  # the executor feeds one placeholder argument per item
        def fn(_item: Any = None, _f: Callable[..., Any] = func) -> Any:
            return _f()
    elif kinds & {inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD}:
        def fn(*args: Any, _f: Callable[..., Any] = func) -> Any:
            return _f(**dict(zip(params, args)))
    if node.is_generator:
        inner = fn

        def fn(*args: Any) -> Any:
            return join_chunks(list(inner(*args)), node.empty)
    return fn
