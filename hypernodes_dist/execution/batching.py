"""Batch nodes (``@node(batch_size=N)``): many items per call, everything else per item.

How every executor fills a batch node's calls (one call's arguments and return checks are
``batchcall.py``'s; ``run()``/``iter()`` and the reactive scheduler call it with one-item
lists through ``invoke.call_node`` -> ``batchcall.call_single``):

- ``call_column``: the columnar strategy's items of one node, cut into calls of at most
  ``batch_size`` items in item order (cache hits and duplicates were already taken out);
  async calls run concurrently, at most ``settings.concurrency`` calls in flight.
- ``fill``: the item flow's items, one at a time as they reach the node: the first item
  waiting opens a call that closes when ``batch_size`` items wait or ``FILL_SECONDS`` after
  it opened, whichever comes first (items of every batch of the flow on this event loop
  share calls).

A call passes, for every parameter that is not a resource, the list of its items' values
(``batched``), except the node's ``scalars`` and the inputs its resources read: one value
per call, so only items with the same values of those share a call (``split``; a flow
keeps one open call per distinct values). It returns one value per item: a list (or an Arrow/NumPy array), a tuple
of lists for several outputs. An ``Exception`` instance in an item's slot fails that item
alone; a call that raises fails each of its items (each gets its own copy of the error);
a return of another length fails every item of the call (``BatchLengthError``). Policies
wrap the call: one retry re-runs the whole call, one concurrency slot and one rate-limit
turn per call. Engines cut their batches to multiples of the largest ``batch_size``
(``fit_size``) so calls are full.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import CancelledError, Future
from typing import Any

from hypernodes_dist.execution.batchcall import (
    Scalars,
    call_kwargs,
    each_item,
    invoke,
    scalar_values,
    split,
    unpack,
)
from hypernodes_dist.execution.guard import Attempts, Guard
from hypernodes_dist.execution.syncio import gather_tasks
from hypernodes_dist.nodes import HyperNode
from hypernodes_dist.perprocess import PROCESS
from hypernodes_dist.plan import Plan

__all__ = ["FILL_SECONDS", "run_call", "call_column", "fill", "fit_size", "largest_batch",
           "item_window"]

FILL_SECONDS = 0.010  # how long a flowing map's open call waits for more items


# ----------------------------------------------------------------------------- the plan


def largest_batch(plan: Plan) -> int:
    """The largest ``batch_size`` of the plan's nodes (0: no batch node)."""
    return max((n.batch_size or 0 for n in plan.nodes), default=0)


def fit_size(plan: Plan, size: int) -> int:
    """``size`` (items per engine batch: chunk, partition, Daft UDF batch) rounded up to a
    multiple of the plan's largest ``batch_size``, so its calls are full."""
    largest = largest_batch(plan)
    size = max(1, int(size))
    if largest <= 1:
        return size
    return -(-size // largest) * largest


def item_window(plan: Plan, calls: int) -> int:
    """Items a flowing map keeps in flight for a window of ``calls`` calls: a batch node's
    call holds up to ``batch_size`` items."""
    return max(1, calls) * max(1, largest_batch(plan))


async def run_call(node: HyperNode, columns: Sequence[list[Any]], n: int,
                   guard: Guard | None, item: int, blocking: bool) -> tuple[list[Any], float]:
    """One call over ``n`` items under the node's ``guard``: ``(values, start)``, the start
    of the successful attempt. ``blocking``: the caller has no event loop (sync nodes)."""
    kwargs = call_kwargs(node, columns)
    if guard is None:
        start = time.perf_counter()
        return unpack(node, await invoke(node, kwargs), n), start
    timing = Attempts()
    value = await guard.run(lambda: invoke(node, kwargs), item, blocking=blocking,
                            timing=timing)
    return unpack(node, value, n), timing.start


# ----------------------------------------------------------------------------- columns


OnCall = Callable[[Sequence[int], list[Any], float, float], None]
Done = tuple[list[Any], float, float]  # a call's values, start and end


async def call_column(node: HyperNode, todo: Sequence[int], its: Sequence[Iterable[Any]],
                      guard: Guard | None, first: int, limit: int | None,
                      on_call: OnCall, keys: Sequence[str] | None = None,
                      scope: str = "") -> None:
    """Calls over the items ``todo`` (argument iterators ``its``, one per parameter), in
    item order; after each, ``on_call(positions, values, start, end)``: the call's positions
    in ``todo``, per item its value or an ``Exception`` (its failure). ``first``: the
    chunk's offset (item numbers in policy events); ``limit``: async calls in flight
    (``None``: all); ``keys``: the items' cache keys: an item whose key a call of another
    batch of the same map (``scope``) in this process computes, or has just computed, takes
    its value instead of entering a call."""
    columns = [list(it) for it in its]
    blocking = not (node.is_async or node.streaming)
    own: Sequence[int] = range(len(todo))  # slices of a range stay ranges: no list per call
    twins: dict[int, Future[Done]] = {}
    claimed: dict[str, Future[Done]] = {}
    if keys is not None:
        own, twins, claimed = _claim(node, scope, keys, blocking)
    groups = split(node, columns, own)

    async def one(group: Sequence[int]) -> None:
        if type(group) is range:
            cols = [col[group.start:group.stop] for col in columns]
        else:
            cols = [[col[k] for k in group] for col in columns]
        try:
            values, start = await run_call(node, cols, len(group), guard, first + todo[group[0]],
                                           blocking)
        except Exception as exc:
            start, values = time.perf_counter(), each_item(exc, len(group))
        end = time.perf_counter()
        if claimed:
            for k, value in zip(group, values):
                future = claimed.get(keys[k])  # type: ignore[index]  # claimed holds only keyed items, so keys[k] is a str
                if future is not None and not future.done():
                    future.set_result(([value], start, end))
        on_call(group, values, start, end)

    try:
        if blocking:
            for group in groups:
                await one(group)
            for k, future in twins.items():  # served by another thread's call
                await _twin(future, one, on_call, k, wait=False)
        else:
            await _gather(groups, twins, one, on_call, limit)
    finally:
        _release(node, scope, claimed)


async def _twin(future: Future[Done], one: Callable[[Sequence[int]], Any], on_call: OnCall,
                k: int, wait: bool) -> None:
    """Item ``k`` takes the value an identical item's call produced (``wait``: awaited on
    the loop; else the thread blocks); if that call never ran, ``k`` is called here."""
    try:
        if wait:
            (value,), start, end = await asyncio.shield(asyncio.wrap_future(future))
        else:
            (value,), start, end = future.result()
    except (asyncio.CancelledError, CancelledError):
        if not future.cancelled():  # this batch is cancelled
            raise
        await one([k])
        return
    on_call([k], each_item(value, 2)[1:] if isinstance(value, Exception) else [value],
            start, end)


async def _gather(groups: list[Sequence[int]], twins: dict[int, Future[Done]],
                  one: Callable[[Sequence[int]], Any], on_call: OnCall,
                  limit: int | None) -> None:
    """Async calls at most ``limit`` at once; a failure raised (``on_error="raise"``)
    stops the others."""
    sem = asyncio.Semaphore(limit or len(groups) or 1)

    async def bounded(group: Sequence[int]) -> None:
        async with sem:
            await one(group)

    await gather_tasks([*(bounded(g) for g in groups),
                        *(_twin(f, one, on_call, k, wait=True) for k, f in twins.items())])


Claims = dict[str, tuple[Future[Done], int]]  # key -> (its call's result, thread)
# per node, per map (its run prefix): the keys whose calls are in flight or just finished
_RUNNING: weakref.WeakKeyDictionary[HyperNode, dict[str, Claims]] = weakref.WeakKeyDictionary()
RECENT = 1024  # finished calls' results kept per node and map: a batch that missed the
# cache before another batch's call finished (its writes not in the cache yet) reuses them
MAPS = 4  # maps remembered per node (the oldest go first)


def _claims(node: HyperNode, scope: str) -> Claims:
    maps = _RUNNING.setdefault(node, {})
    found = maps.get(scope)
    if found is None:
        found = maps[scope] = {}
        for old in list(maps)[:-MAPS]:
            if all(f.done() for f, _ in maps[old].values()):
                del maps[old]
    return found


def _claim(node: HyperNode, scope: str, keys: Sequence[str], blocking: bool
           ) -> tuple[list[int], dict[int, Future[Done]], dict[str, Future[Done]]]:
    """Positions to call, positions served by another batch's call of the same map (its
    futures: in flight, or finished a moment ago), and the keys this batch claims. A
    blocking batch never waits on its own thread's calls in flight (a sync batch runs its
    calls without letting another batch of its thread in)."""
    me = threading.get_ident()
    with _lock:
        running = _claims(node, scope)
        own: list[int] = []
        twins: dict[int, Future[Any]] = {}
        claimed: dict[str, Any] = {}
        for k, key in enumerate(keys):
            found = running.get(key) if key else None
            if found is not None and not found[0].cancelled() and (
                    found[0].done() or not (blocking and found[1] == me)):
                twins[k] = found[0]
                continue
            own.append(k)
            if key:
                claimed[key] = Future()
                running[key] = (claimed[key], me)
    return (range(len(keys)) if not twins else own), twins, claimed  # type: ignore[return-value]  # a range of every position where no item is a twin


def _release(node: HyperNode, scope: str, claimed: dict[str, Future[Done]]) -> None:
    """This batch's calls are over: keys whose call never ran or failed are no longer
    claimed (later batches call them); finished ones stay, the last ``RECENT``."""
    if not claimed:
        return
    with _lock:
        running = _claims(node, scope)
        for key, future in claimed.items():
            if future.cancel() or isinstance(future.result()[0][0], Exception):
                found = running.get(key)
                if found is not None and found[0] is future:
                    del running[key]
        excess = len(running) - RECENT
        if excess > 0:
            for key in [k for k, (f, _) in running.items() if f.done()][:excess]:
                del running[key]


def _remember(node: HyperNode, scope: str, key: str, done: Done) -> None:
    """A flow's call computed ``key``: later batches of the map take it (``_recent``)."""
    future: Future[Done] = Future()
    future.set_result(done)
    with _lock:
        running = _claims(node, scope)
        running[key] = (future, threading.get_ident())
        if len(running) > RECENT:
            for old in [k for k, (f, _) in running.items() if f.done()][:len(running) - RECENT]:
                del running[old]


def _recent(node: HyperNode, scope: str, key: str) -> Done | None:
    with _lock:
        found = _claims(node, scope).get(key)
    if found is None or not found[0].done() or found[0].cancelled():
        return None
    return found[0].result()


# ----------------------------------------------------------------------------- flows


class _Call:
    """Items waiting to enter one call (flows): their arguments, numbers and futures;
    ``twins``: items of other batches with the key of a slot, served by that slot."""

    __slots__ = ("rows", "items", "futures", "guard", "task", "twins", "keys", "timer")

    def __init__(self, guard: Guard | None) -> None:
        self.timer: asyncio.TimerHandle | None = None  # closes it when its wait is over
        self.rows: list[dict[str, Any]] = []
        self.items: list[int] = []
        self.futures: list[asyncio.Future[Any]] = []
        self.guard = guard
        self.task: asyncio.Task[None] | None = None
        self.twins: dict[int, list[asyncio.Future[Any]]] = {}
        self.keys: list[tuple[str, str] | None] = []  # per slot: (map, cache key)

    def waiting(self) -> bool:
        """Whether an item still waits for this call."""
        return not all(f.done() for f in self.futures) or any(
            not f.done() for twins in self.twins.values() for f in twins)


class _Filler:
    """Fills the calls of one batch node on one event loop (see the module docstring)."""

    def __init__(self, node: HyperNode, loop: asyncio.AbstractEventLoop) -> None:
        self.node, self.loop = node, loop
        self.open = Scalars()  # the open call of each distinct values of the scalars
        self.opened = 0  # open calls
        self.running: set[_Call] = set()
        self.keys: dict[str, tuple[_Call, int]] = {}  # cache key -> the slot computing it

    def submit(self, kwargs: dict[str, Any], guard: Guard | None, item: int,
               key: str | None, scope: str) -> tuple[_Call, asyncio.Future[Any]]:
        future = self.loop.create_future()
        if key:
            found = self.keys.get(key)
            if found is not None:  # an identical item is in a call: it enters once
                found[0].twins.setdefault(found[1], []).append(future)
                return found[0], future
        values = scalar_values(self.node, kwargs)
        call = self.open.get(values)
        if call is None:
            call = _Call(guard)
            self.open.put(values, call)
            self.opened += 1
            call.timer = self.loop.call_later(FILL_SECONDS, self.close, call)
        if key:
            self.keys[key] = (call, len(call.rows))
        call.rows.append(kwargs)
        call.keys.append((scope, key) if key else None)
        call.items.append(item)
        call.futures.append(future)
        if len(call.rows) >= (self.node.batch_size or 1):
            self.close(call)
        return call, future

    def _unopen(self, call: _Call) -> None:
        """``call`` is no longer open: later items open another."""
        self.open.remove(call)
        self.opened -= 1
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None

    def close(self, call: _Call) -> None:
        """Send the open ``call`` (full, or its wait is over)."""
        self._unopen(call)
        self.running.add(call)
        call.task = self.loop.create_task(self._run(call))

    async def _run(self, call: _Call) -> None:
        node = self.node
        live = [k for k, f in enumerate(call.futures) if not f.done()]  # not cancelled
        live.sort(key=call.items.__getitem__)  # a call's lists are in item order
        try:
            if not live:
                return
            cols = [[call.rows[k][p] for k in live] for p in node.params]
            try:
                values, start = await run_call(node, cols, len(live), call.guard,
                                               call.items[live[0]], False)
            except Exception as exc:
                start, values = time.perf_counter(), each_item(exc, len(live))
            end = time.perf_counter()
            for k, value in zip(live, values):
                scoped = call.keys[k]
                if scoped is not None and not isinstance(value, Exception):
                    _remember(node, *scoped, ([value], start, end))
                futures = [call.futures[k], *call.twins.get(k, ())]
                each = each_item(value, len(futures)) if isinstance(value, Exception) else (
                    [value] * len(futures))
                for future, one in zip(futures, each):
                    if not future.done():
                        future.set_result((one, start, end))
        finally:
            self.running.discard(call)
            for key in [k for k, (c, _) in self.keys.items() if c is call]:
                del self.keys[key]
            self._forget()

    def cancelled(self, call: _Call) -> None:
        """An item stopped waiting: a call none of whose items waits any more stops."""
        if not call.waiting():
            if call.task is None:  # still open
                self._unopen(call)
                for key in [k for k, (c, _) in self.keys.items() if c is call]:
                    del self.keys[key]
                self._forget()
            else:
                call.task.cancel()

    def _forget(self) -> None:
        if not self.opened and not self.running:
            with _lock:
                per_loop = _FILLERS.get(self.node)
                if per_loop is not None and per_loop.get(self.loop) is self:
                    del per_loop[self.loop]


_FILLERS: weakref.WeakKeyDictionary[HyperNode, dict[asyncio.AbstractEventLoop, _Filler]] = (
    weakref.WeakKeyDictionary())
_lock = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child has no calls in flight and no fillers (their loop is the parent's)."""
    global _lock
    _RUNNING.clear()
    _FILLERS.clear()
    _lock = threading.Lock()


PROCESS.register("execution.batching", _forget_after_fork)


def _filler(node: HyperNode) -> _Filler:
    loop = asyncio.get_running_loop()
    with _lock:
        per_loop = _FILLERS.setdefault(node, {})
        found = per_loop.get(loop)
        if found is None:
            found = per_loop[loop] = _Filler(node, loop)
    return found


async def fill(node: HyperNode, kwargs: dict[str, Any], guard: Guard | None,
               item: int, key: str | None = None, scope: str = "") -> tuple[Any, float, float]:
    """Item ``item``'s value through a shared call of ``node`` (flows): ``(value, start,
    end)`` of its call; raises the item's error. Items with one cache ``key`` share a
    slot (identical keys enter once, across the batches of the flow), or take the value a
    call of the same map (``scope``) has just computed."""
    if key:
        done = _recent(node, scope, key)
        if done is not None:
            return done[0][0], done[1], done[2]
    filler = _filler(node)
    call, future = filler.submit(kwargs, guard, item, key, scope)
    try:
        value, start, end = await future
    except asyncio.CancelledError:
        future.cancel()
        filler.cancelled(call)
        raise
    if isinstance(value, Exception):
        raise value
    return value, start, end

