"""Calling one node over a column of items: the calling half of the columnar strategy.

Sync nodes run as one C-level ``map`` over the argument columns, each call timed at C
level (``Clock``) and handed to the cache in slices; async nodes run as one ``gather``
(at most ``settings.concurrency`` calls in flight). A node's ``Policy`` wraps its calls
through a ``Guard``. ``ColumnCalls`` is mixed into ``Columnar``, whose state it reads:
``plan``, ``n``, ``values``, ``consts``, ``settings``, ``chunk``, ``events``, ``timing``,
``times``, ``guards``, ``usage``, ``calls``, ``ticks`` (the progress channel: its
``_advance(calls done)`` runs after each slice or call). Without events a sync node's calls
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice, repeat, starmap
from operator import itemgetter
from typing import Any

from hypernodes_dist.cache.keys import FLUSH_SECONDS
from hypernodes_dist.execution.batching import call_column
from hypernodes_dist.execution.context import PARENT, Parent
from hypernodes_dist.execution.guard import Guard, timed_call
from hypernodes_dist.execution.invoke import join_chunks
from hypernodes_dist.execution.job import TimedSpan
from hypernodes_dist.missing import MISSING
from hypernodes_dist.nodes import HyperNode
from hypernodes_dist.policies.usage import NODE, NodeTotal, add_usage, node_total

__all__ = ["ColumnCalls", "Clock", "PERSIST_SLICE", "Persist"]

PERSIST_SLICE = 64  # at most this many cacheable sync calls between two hand-overs
PROGRESS_SLICE = 4096  # without a cache, at most this many calls between progress reports
# the slice size a node reached in its last batch (slices still halve as soon as one is slow)
_SLICES: weakref.WeakKeyDictionary[HyperNode, int] = weakref.WeakKeyDictionary()
Persist = Callable[[Sequence[int], Sequence[Any]], None]


class ColumnCalls:
    """How ``Columnar`` calls one node over the items in ``todo``."""

    def _args(self, node: HyperNode, todo: Sequence[int]) -> list[Iterator[Any]]:
        full = len(todo) == self.n
        count = len(todo)
        its = []
        for p in node.params:
            if p in self.values:
                col = self.values[p]
                if p in node.defaults and p in self.plan.producers:  # absent -> default
                    default = node.defaults[p]
                    col = [default if v is MISSING else v for v in col]
                its.append(iter(col) if full else iter([col[i] for i in todo]))
            elif p in self.consts:
                its.append(repeat(self.consts[p], count))
            else:
                its.append(repeat(node.defaults[p], count))
        if not its:
            its.append(repeat(None, count))
        return its

    async def _call(self, node: HyperNode, todo: Sequence[int], persist: Persist | None) -> list[Any]:
        """``node``'s calls over ``todo``; what they ``meter`` is kept per item (``usage``)."""
        if not todo:
            return []
        total = node_total(node.name)  # what unguarded calls meter (``policies/usage.py``)
        token = NODE.set(total)
        try:
            return await self._call_column(node, todo, persist)
        finally:
            NODE.reset(token)
            self._harvest(node, total)

    def _harvest(self, node: HyperNode, total: NodeTotal) -> None:
        """Move what the node's guard metered per item (and the rest) into ``usage``."""
        guard = self.guards.pop(node.name, None)
        kept = self.usage.setdefault(node.name, {})
        if guard is not None:
            offset = self.chunk.offset
            for item, usage in guard.usage.items():
                kept[-1 if item is None else item - offset] = usage
            guard.usage = {}
            if node.batch_size is not None:
                self.calls[node.name] = self.calls.get(node.name, 0) + guard.calls
        if total.usage:  # metered outside a guarded call: the node's, not an item's
            add_usage(kept.setdefault(-1, {}), total.usage)
        if not kept:
            del self.usage[node.name]

    async def _call_column(self, node: HyperNode, todo: Sequence[int],
                           persist: Persist | None) -> list[Any]:
        if node.batch_size is not None:
            return await self._call_batches(node, todo, persist)
        fn = _positional(node)
        guard = self._guard(node) if node.guarded else None  # policies.py
        if node.is_async or (node.streaming and not node.is_generator):
            return await self._call_async(node, todo, guard, persist)
        if guard is not None:
            fn = guard.positional(fn, [self.chunk.offset + i for i in todo])
        clock = None
        if self.settings.want_events:
            clock = Clock()
            self.timing[node.name] = (todo, clock)
        if node.nests:  # inner runs are children of the item's run (events, cache, session)
            fn, clock = self._nesting(fn, todo, clock), None
        spans: list[TimedSpan] | None = None
        if clock is None:  # no per-call clock: spans of calls timed together (``_per_call``)
            spans = []
            self.times[node.name] = (todo, spans)
        its = self._args(node, todo)
        out: list[Any] = []
        if persist is None and self.ticks is None:
            if spans is not None and len(todo) > PROBE:
                self._map(node, fn, [islice(it, PROBE) for it in its], todo, out, None, spans)
                clock = _per_call(spans, len(out))
            self._map(node, fn, its, todo, out, clock, spans)
            _close(spans, len(out))
            return out
        # persist (and report progress) as slices finish; slices adapt to the call time
        cap = PERSIST_SLICE if persist is not None else PROGRESS_SLICE
        start, size = 0, min(_SLICES.get(node, 1), cap)
        while start < len(todo):
            stop = min(start + size, len(todo))
            t0 = time.monotonic()
            try:
                self._map(node, fn, [islice(it, stop - start) for it in its], todo, out, clock,
                          spans)
            finally:  # even on Ctrl-C: what finished in this slice is kept
                if persist is not None:
                    persist(todo[start:len(out)], out[start:])
                self._advance(len(out))
            if start == 0 and spans is not None:
                clock = _per_call(spans, len(out))
            quick = time.monotonic() - t0 < FLUSH_SECONDS / 4
            size = min(size * 2, cap) if quick else max(1, size // 2)
            start = stop
        _close(spans, len(out))
        _SLICES[node] = size
        return out

    async def _call_batches(self, node: HyperNode, todo: Sequence[int],
                            persist: Persist | None) -> list[Any]:
        """A batch node's calls over ``todo`` (``batching.py``); failures recorded per item,
        results handed to the cache after each call."""
        guard = self._guard(node) if node.guarded else None
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
                        self._record_failure(node, todo[k], value)
                    else:
                        out[k] = value
                    clock.starts[k], clock.ends[k] = start, end
            if persist is not None:
                persist([todo[k] for k in positions], [out[k] for k in positions])
            called += len(positions)
            self._advance(called)

        self.timing[node.name] = (todo, clock)
        node_keys = self.node_keys.get(node.name)
        keys = None if node_keys is None else [node_keys[i] for i in todo]
        await call_column(node, todo, self._args(node, todo), guard, self.chunk.offset,
                          self.settings.concurrency, on_call, keys, self.settings.run_prefix)
        return out

    def _map(self, node: HyperNode, fn: Callable[..., Any], its: list[Iterator[Any]],
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
                self._record_failure(node, todo[len(out)], exc)
                out.append(MISSING)
        if spans is not None and clock is None and len(out) > first:
            spans.append(TimedSpan(first, len(out), t0, time.perf_counter()))
        return out

    async def _call_async(self, node: HyperNode, todo: Sequence[int], guard: Any = None,
                          persist: Persist | None = None) -> list[Any]:
        its = self._args(node, todo)
        limit = self.settings.concurrency or len(todo)
        plain = (guard is None and persist is None and not self.settings.want_events
                 and not node.nests and self.ticks is None)
        if plain and node.is_async and not node.streaming and len(todo) <= limit:
            t0 = time.perf_counter()
            results = await asyncio.gather(*map(_positional(node), *its), return_exceptions=True)
            self.times[node.name] = (todo, [TimedSpan(0, len(todo), t0, time.perf_counter())])
            return self._gathered(node, todo, results)
        sem = asyncio.Semaphore(limit)
        params = node.params
        called = 0

        async def one(args: tuple[Any, ...], i: int) -> Any:
            nonlocal called
            if node.nests:  # this task's own context
                PARENT.set(self._parent(i))
            async with sem:
                kwargs = dict(zip(params, args)) if params else {}
                value, t0 = await timed_call(node, kwargs, guard, self.chunk.offset + i)
                if persist is not None:
                    persist((i,), (value,))
                called += 1
                self._advance(called)
                return value, t0, time.perf_counter()

        results = await asyncio.gather(
            *(one(a if params else (), i) for a, i in zip(zip(*its), todo)), return_exceptions=True
        )
        clock = Clock()
        clock.add(*zip(*[(0.0, 0.0) if isinstance(r, BaseException) else r[1:] for r in results]))
        self.timing[node.name] = (todo, clock)
        return self._gathered(node, todo, [
            r if isinstance(r, BaseException) else r[0] for r in results])

    def _gathered(self, node: HyperNode, todo: Sequence[int], results: list[Any]) -> list[Any]:
        """``gather`` results -> values, failures recorded per item (MISSING in their place)."""
        out = []
        for i, r in zip(todo, results):
            if isinstance(r, BaseException):
                if not isinstance(r, Exception):
                    raise r
                self._record_failure(node, i, r)
                out.append(MISSING)
            else:
                out.append(r)
        return out

    def _nesting(self, fn: Callable[..., Any], todo: Sequence[int],
                 clock: Clock | None) -> Callable[..., Any]:
        """``fn`` (timed into ``clock`` when given) with each call's inner runs as children
        of the item's run: they report to this batch's events and share its cache."""
        positions = iter(todo)
        now = time.perf_counter

        def nesting(*args: Any) -> Any:
            token = PARENT.set(self._parent(next(positions)))
            start = now()
            try:
                return fn(*args)
            finally:
                if clock is not None:
                    clock.add((start,), (now(),))
                PARENT.reset(token)

        return nesting

    def _parent(self, i: int) -> Parent:
        s = self.settings
        emit = self.events.append if s.want_events else None
        return Parent(emit, s.session_id, s.run_id(self.chunk.offset + i), s.cache)

    def _guard(self, node: HyperNode) -> Any:
        """The node's call policy for this batch; ``PolicyEvent``s join the batch's events."""
        report = None
        if self.settings.want_events:
            s, events = self.settings, self.events

            def report(event: Any) -> None:
                event.session_id, event.run_id = s.session_id, s.run_id(event.item_index)
                event.step_index = self.plan.position[node.name]
                events.append(event)

        guard = self.guards[node.name] = Guard(node, report, self.settings.budget)
        if self.ticks is not None:  # the progress channel carries what calls meter
            metered = self.metered
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


class Clock:
    """``perf_counter`` start and end of each call of one node, aligned with its items.

    ``run`` reads the clock at C level: ``zip`` pulls one call from ``map`` (its value goes
    straight into ``out``), then one reading (that call's end, the next call's start); no
    Python frame and no object per call survives. Readings are kept as arrays of doubles
    (8 bytes each, untracked by the garbage collector, pickled as one block of bytes).
    """

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts = array("d")
        self.ends = array("d")

    def add(self, starts: Iterable[float], ends: Iterable[float]) -> None:
        self.starts.extend(starts)
        self.ends.extend(ends)

    def run(self, fn: Callable[..., Any], its: list[Iterator[Any]], out: list[Any]) -> None:
        ends = array("d")
        start = time.perf_counter()
        try:
            ends.extend(map(_second, zip(map(out.append, map(fn, *its)),
                                         starmap(time.perf_counter, repeat(())))))
        except BaseException:
            last = self._keep(ends, start)
            self.add((last,), (time.perf_counter(),))  # the failing call
            raise
        self._keep(ends, start)

    def _keep(self, ends: array[float], start: float) -> float:
        """Keep the finished calls' times; returns when the last one ended (``start``: none)."""
        if not ends:
            return start
        self.starts.append(start)
        self.starts.extend(ends[:-1])
        self.ends.extend(ends)
        return ends[-1]


_second = itemgetter(1)


_POSITIONAL: weakref.WeakKeyDictionary[HyperNode, Callable[..., Any]] = weakref.WeakKeyDictionary()


def _positional(node: HyperNode) -> Callable[..., Any]:
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
    if not params:  # the executor feeds one placeholder argument per item
        def fn(_item: Any = None, _f: Callable[..., Any] = node.func) -> Any:  # type: ignore[misc]
            return _f()
    elif kinds & {inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD}:
        def fn(*args: Any, _f: Callable[..., Any] = node.func) -> Any:  # type: ignore[misc]
            return _f(**dict(zip(params, args)))
    if node.is_generator:
        inner = fn

        def fn(*args: Any) -> Any:  # type: ignore[misc]
            return join_chunks(list(inner(*args)), node.empty)
    return fn
