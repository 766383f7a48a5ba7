"""The item-flow strategy: every item walks the plan on its own, no batch barriers.

Acyclic plans that wait on the outside world (``Plan.flows``: async nodes, or nodes whose
policy waits: back-off, limits, timeouts) run here. Each item is a task that runs the
plan's nodes in order, so an item that waits (throttled, retrying, slow) holds back no
other item's downstream nodes: the others run on, and the next items start in its place.
At most ``window`` items are in flight; an item sleeping in a retry back-off gives its
place back (``guard.WINDOW``) so waiting never starves the limits.

The batch's state is the columnar strategy's ``BatchState`` (value columns, branch/gate
decisions per item, chained cache keys precomputed for static plans with their hits
fetched in one lookup per node, failures, the result and its ``BatchEvent``); a ``Flow``
adds what items in flight need (their timings, the hits to report, the unguarded usage
totals). ``drive`` starts items in order under one window; ``run_flow`` drives one batch
(a Dask task, a Daft UDF call), and the local engine drives many batches under one window
(``engines/local.py``), so the calls of the next batch are in flight while a batch ends.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from array import array
from collections.abc import Callable, Coroutine, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypernodes_dist.cache.keys import WriteBuffer, scope_token
from hypernodes_dist.events import NodeColumns
from hypernodes_dist.execution.batching import fill, item_window
from hypernodes_dist.execution.batchkeys import given_ids, item_id, lookup, precompute_keys
from hypernodes_dist.execution.calls import guard_for, parent_of
from hypernodes_dist.execution.clock import Clock
from hypernodes_dist.execution.context import PARENT
from hypernodes_dist.execution.guard import WINDOW, timed_call
from hypernodes_dist.execution.invoke import split_outputs
from hypernodes_dist.execution.job import HIT, RAN, BatchSettings, Chunk, ColumnarResult, TimedSpan
from hypernodes_dist.execution.running import Halt
from hypernodes_dist.execution.state import (
    BatchState,
    build_result,
    harvest,
    new_state,
    record_failure,
    src_column,
    store,
    usage_of,
)
from hypernodes_dist.missing import MISSING
from hypernodes_dist.nodes import HyperNode
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.usage import NODE, NodeTotal, node_total

__all__ = ["Flow", "start_flow", "run_flow", "run_item", "finish", "drive", "Window"]

Ran = tuple[list[int], "array[float]", "array[float]"]  # items, starts, ends


@dataclass(eq=False, slots=True)
class Flow:
    """One batch whose items flow: its ``BatchState`` and what items in flight need."""

    st: BatchState
    pending: int  # items not finished yet
    totals: dict[str, NodeTotal]  # node -> what its calls metered outside a guarded call
    required: dict[str, tuple[str, ...]]  # produced inputs without a default, per node
    token: str | None = None  # the cache scope's token (scope "run": per item instead)
    prefetched: dict[str, dict[int, Any]] = field(default_factory=dict)  # hits, by node
    ran: dict[str, Ran] = field(default_factory=dict)  # node -> its calls' timings
    hit_items: dict[str, list[int]] = field(default_factory=dict)  # events: hits by node
    halt: Halt | None = None  # the map's stop in this process (``running.py``)


def start_flow(plan: Plan, chunk: Chunk, settings: BatchSettings,
               writes: WriteBuffer | None) -> Flow:
    """A batch ready to flow: one guard per node, its static keys and their hits fetched."""
    st = new_state(plan, chunk, settings, writes)
    flow = Flow(st, chunk.n, {n.name: node_total(n.name) for n in plan.nodes}, {
        n.name: tuple(p for p in n.params if p in plan.producers and p not in n.defaults)
        for n in plan.nodes})
    hit_items = flow.hit_items

    def record(st: BatchState, node: HyperNode, items: Sequence[int], code: int) -> None:
        if items and code == HIT:  # executions are timed into ``ran`` as they finish
            hit_items.setdefault(node.name, []).extend(items)

    st.record = record
    for node in plan.nodes:  # one guard per node for the whole batch
        if node.guarded:
            guard_for(st, node)
    st.view.running = {}  # keys in flight: identical items wait for the first
    if st.keys is not None:
        flow.token = scope_token(st.keys.scope, settings.session_id, "")
        if plan.static:
            for node in plan.nodes:
                precompute_keys(st, node)
            for name in st.node_keys:  # one lookup per node for the whole batch
                flow.prefetched[name] = lookup(st, plan.by_name[name], range(st.n))
    return flow


async def run_flow(plan: Plan, chunk: Chunk, settings: BatchSettings,
                   writes: WriteBuffer | None, halt: Halt | None = None) -> ColumnarResult:
    """Every item of the batch, at most ``settings.concurrency`` (default: all) at once;
    once ``halt`` says the map stopped, items start no further node call."""
    flow = start_flow(plan, chunk, settings, writes)
    flow.halt = halt
    calls = settings.concurrency
    window = Window(item_window(plan, calls) if calls else chunk.n)
    await drive(((flow, i) for i in range(chunk.n)), window)
    return finish(flow)


# -- one item ----------------------------------------------------------------------------
async def run_item(flow: Flow, i: int) -> None:
    """Item ``i`` through every node it takes part in, in plan order (until the map
    stops: ``Flow.halt``)."""
    st = flow.st
    failed, ended, halt = st.failed, st.ended, flow.halt
    try:
        for node in st.plan.nodes:
            if i in failed or i in ended or (halt is not None and halt.stopped):
                return
            if _takes_part(flow, node, i):
                await _step(flow, node, i)
    finally:
        flow.pending -= 1
        if st.ticks is not None:
            st.ticks.tick(st.chunk.offset, st.n - flow.pending, st.metered)


def _takes_part(flow: Flow, node: HyperNode, i: int) -> bool:
    st = flow.st
    active = st.active.get(node.name)
    if active is not None and i not in active:
        return False
    values = st.values
    for p in flow.required[node.name]:
        col = values.get(p)
        if col is None or col[i] is MISSING:
            return False
    return True


async def _step(flow: Flow, node: HyperNode, i: int) -> None:
    st = flow.st
    key = None
    if st.keys is not None and st.keys.cacheable(node):
        key = _key_of(flow, node, i)
        value = _cached(flow, node, i, key)
        if value is MISSING and st.view.computing(key):  # an identical item computes it
            value = await st.view.in_flight(key)
        if value is not MISSING:
            _put(st, node, i, value, HIT)
            return
    shared = key is not None and node.kind == "function" and bool(node.outputs)
    if shared:  # not decisions
        st.view.begin(key)  # type: ignore[arg-type]  # shared implies key is not None
    try:
        await _compute(flow, node, i, key)
    finally:
        if shared:
            st.view.end(key, _value_of(st, node, i))  # type: ignore[arg-type]  # shared implies key is not None


def _value_of(st: BatchState, node: HyperNode, i: int) -> Any:
    """What item ``i``'s execution of ``node`` produced (``MISSING``: it failed)."""
    if i in st.failed or st.codes[node.name][i] != RAN:
        return MISSING
    names = node.outputs
    if len(names) == 1:
        return st.values[names[0]][i]
    outputs = [st.values[o][i] for o in names]
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


async def _compute(flow: Flow, node: HyperNode, i: int, key: str | None) -> None:
    st = flow.st
    kwargs = _kwargs(st, node, i)
    guard = st.guards.get(node.name)
    index = st.chunk.offset + i
    nested = None
    if node.nests:  # inner runs are children of the item's run (events, cache, session)
        nested = PARENT.set(parent_of(st, i))
    t1 = None
    metered = NODE.set(flow.totals[node.name])
    try:
        if node.batch_size is not None:  # the item joins a shared call (batching.py)
            value, t0, t1 = await fill(node, kwargs, guard, index, key, st.settings.run_prefix)
        else:
            value, t0 = await timed_call(node, kwargs, guard, index)
    except Exception as exc:
        record_failure(st, node, i, exc)
        return
    finally:
        NODE.reset(metered)
        if nested is not None:
            PARENT.reset(nested)
    _timed(flow, node.name, i, t0, t1 or time.perf_counter())
    if key is not None:
        st.view.write(node.name, key, value)
    _put(st, node, i, value, RAN)


def _put(st: BatchState, node: HyperNode, i: int, value: Any, code: int) -> None:
    """``state.store`` for one item, in O(1) (that one makes a column per call)."""
    if node.targets:  # a decision: no output column
        store(st, node, {i: value}, code)
        return
    outputs = node.outputs
    if len(outputs) == 1:
        parts: Any = (value,)
    else:
        try:
            parts = split_outputs(node, value)
        except Exception as exc:
            record_failure(st, node, i, exc)
            return
    node_keys = st.node_keys.get(node.name)
    src_key = node_keys[i] if node_keys is not None else None
    values = st.values
    for name, part in zip(outputs, parts):
        col = values.get(name)
        if col is None:
            col = values[name] = [MISSING] * st.n
        col[i] = part
        src_column(st, name)[i] = src_key
    st.codes[node.name][i] = code
    if code == HIT and st.settings.want_events and st.record is not None:
        st.record(st, node, (i,), code)


def _kwargs(st: BatchState, node: HyperNode, i: int) -> dict[str, Any]:
    values, consts, defaults = st.values, st.consts, node.defaults
    kwargs = {}
    for p in node.params:
        col = values.get(p)
        if col is not None:
            v = col[i]
            kwargs[p] = defaults[p] if v is MISSING else v
        elif p in consts:
            kwargs[p] = consts[p]
        else:
            kwargs[p] = defaults[p]
    return kwargs


# -- cache keys, one item at a time ------------------------------------------------------
def _key_of(flow: Flow, node: HyperNode, i: int) -> str:
    st = flow.st
    node_keys = st.node_keys.get(node.name)
    if node_keys is not None and node_keys[i] is not None:
        return node_keys[i]
    key = _item_key(flow, node, i)
    if node_keys is None:
        node_keys = st.node_keys[node.name] = [None] * st.n  # type: ignore[list-item]  # each item's key is written in as it is computed
    node_keys[i] = key
    return key


def _item_key(flow: Flow, node: HyperNode, i: int) -> str:
    """Item ``i``'s key of ``node``: the scheduler's chaining (a produced value's id is
    its producer's key; its content hash when the producer is not cacheable)."""
    st = flow.st
    keys = st.keys
    assert keys is not None
    ids = []
    for p in node.params:
        if p not in st.plan.producers:
            given = given_ids(st, node, p)
            ids.append(given if isinstance(given, str) else given[i])
            continue
        col = st.values.get(p)
        value = MISSING if col is None else col[i]
        src = st.src_keys.get(p)
        k = None if src is None else src[i]
        if k is not None:
            ids.append(keys.output_id(k, p))
        elif value is MISSING:
            ids.append(keys.default_id(node, p))
        else:
            ids.append(item_id(st, node, p, i, value))
    token = st.settings.run_id(st.chunk.offset + i) if keys.scope == "run" else flow.token
    return keys.key(node, ids, token)


def _cached(flow: Flow, node: HyperNode, i: int, key: str) -> Any:
    found = flow.prefetched.get(node.name)
    if found is not None:
        value = found.pop(i, MISSING)
        if value is not MISSING:
            return value
    if not key:
        return MISSING
    if found is not None:  # the cache was read for the whole batch already
        return flow.st.view.pending(node.name, key)  # an identical item finished it
    return flow.st.view.get(node.name, key)


# -- timings, events and the result ------------------------------------------------------
def _timed(flow: Flow, name: str, i: int, start: float, end: float) -> None:
    """Item ``i``'s call of ``name`` ran from ``start`` to ``end`` (events and history)."""
    ran = flow.ran.get(name)
    if ran is None:
        ran = flow.ran[name] = ([], array("d"), array("d"))
    ran[0].append(i)
    ran[1].append(start)
    ran[2].append(end)


def finish(flow: Flow) -> ColumnarResult:
    """The batch's ``ColumnarResult`` (its executions as ``NodeColumns``, in item order)."""
    st = flow.st
    for node in st.plan.nodes:  # what the calls metered, per item
        harvest(st, node, flow.totals[node.name])
    if st.settings.want_events:
        for node in st.plan.nodes:
            _columns_of(flow, node)
    for name, (positions, starts, ends) in flow.ran.items():  # the items' history
        clock = Clock()
        clock.starts, clock.ends = starts, ends
        st.times[name] = (positions, [TimedSpan(0, len(positions), 0.0, 0.0, clock)])
    return build_result(st)


def _columns_of(flow: Flow, node: HyperNode) -> None:
    st = flow.st
    name, step = node.name, st.plan.position[node.name]
    outputs = {o: st.values.get(o, [MISSING] * st.n) for o in node.outputs}
    ran = flow.ran.get(name)
    if ran is not None:
        order = sorted(range(len(ran[0])), key=ran[0].__getitem__)
        items = [ran[0][k] for k in order]
        st.events.append(NodeColumns(
            name, step, node.tags, node.kind, False, items,
            array("d", (ran[1][k] for k in order)), array("d", (ran[2][k] for k in order)),
            outputs, usage_of(st, name, items)))
    hits = flow.hit_items.get(name)
    if hits:
        st.events.append(NodeColumns(name, step, node.tags, node.kind, True, sorted(hits),
                                     None, None, outputs))


async def drive(items: Iterable[tuple[Flow, int]], window: Window,
                on_done: Callable[[Flow], Any] | None = None) -> None:
    """Start each ``(flow, item)`` in order, at most ``window`` in flight; ``on_done(flow)``
    after each item. The first error (``on_error="raise"``) cancels the rest and is raised.

    An item starts without a task of its own: its first step runs in the feeding task, in a
    copy of the context, as a task's would. Most items of some maps never wait (a
    ``batch_api`` node's recorded or answered calls) and end there: no task, no loop turn.
    An item that waits goes on in the task that started it (a task-bound scope it entered,
    ``asyncio.timeout`` or an ``anyio`` cancel scope, stays with its task), and a new
    feeding task starts the next items: as many tasks as items that wait."""
    await _Drive(items, window, on_done).run()


class Window(asyncio.Semaphore):
    """``drive``'s items in flight: an ``asyncio.Semaphore`` whose ``take`` takes a free
    place at once (what ``acquire`` does then, without a coroutine an item)."""

    def take(self) -> bool:
        """A place taken, if one is free and no one waits for one (else False: ``acquire``)."""
        if self._value > 0 and not self._waiters:
            self._value -= 1
            return True
        return False


class _Drive:
    """One ``drive``: its items in flight, its feeding tasks, its first failure."""

    def __init__(self, items: Iterable[tuple[Flow, int]], window: Window,
                 on_done: Callable[[Flow], Any] | None) -> None:
        self.feeding = enumerate(items)
        self.window, self.on_done = window, on_done
        self.tasks: dict[int, asyncio.Task[Any] | None] = {}  # in flight (None: not waiting)
        self.failure: list[BaseException] = []
        self.wake = asyncio.Event()  # an item failed, the items ran out, or none runs
        self.ended = False  # the items ran out
        self.feeder: asyncio.Task[None] | None = None  # the task starting items now

    async def run(self) -> None:
        self.feeder = asyncio.get_running_loop().create_task(self.feed())
        try:
            while not self.failure and not (self.ended and not self.tasks):
                self.wake.clear()
                await self.wake.wait()
        finally:
            running = [t for t in {self.feeder, *self.tasks.values()}
                       if t is not None and not t.done()]
            for task in running:  # an error, or the caller was cancelled: stop what runs
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        if self.failure:
            raise self.failure[0]

    async def feed(self, inline: bool = True) -> None:
        """Start items until they run out; inline until one waits: it goes on here, and
        another feeding task starts the next ones, each as a task (items that wait once
        likely wait again: a task each, started at once, as many as the window holds)."""
        window, tasks, started = self.window, self.tasks, 0
        take = window.take  # a free place taken without an await
        loop = asyncio.get_running_loop()
        try:
            for n, (flow, i) in self.feeding:
                if not take():
                    await window.acquire()
                if self.failure:
                    window.release()
                    break
                if not inline:
                    tasks[n] = loop.create_task(self.one(flow, i, n))
                    continue
                tasks[n] = None
                coro = self.one(flow, i, n)
                ctx = contextvars.copy_context()
                try:
                    step = ctx.run(coro.send, None)
                except (StopIteration, asyncio.CancelledError):  # ended (as its task would)
                    started += 1
                    if started % _TURN == 0:
                        await asyncio.sleep(0)  # the loop's other callbacks get a turn
                    continue
                tasks[n] = asyncio.current_task()  # kept while item n runs in it, no longer
                self.feeder = loop.create_task(self.feed(inline=False))
                await _Resumed(coro, step, ctx)
                return
            self.ended = True
        except Exception as exc:  # the items' iterator failed
            self.failure.append(exc)
        self.wake.set()

    async def one(self, flow: Flow, i: int, n: int) -> None:
        WINDOW.set(self.window)
        try:
            await run_item(flow, i)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.failure.append(exc)
            self.wake.set()
            return
        finally:
            self.window.release()
            del self.tasks[n]  # the item is over (here: no done-callback turn)
            if not self.tasks:
                self.wake.set()
        if self.on_done is not None and not self.failure:
            self.on_done(flow)


_TURN = 64  # items started inline between two turns of the loop for its other callbacks


class _Resumed:
    """The rest of a coroutine whose first step ran (it yielded ``step``), awaited by the
    caller's task: what it yields goes to the task, what the task sends or throws back
    goes to it, each step in its own context ``ctx``."""

    __slots__ = ("coro", "step", "ctx")

    def __init__(self, coro: Coroutine[Any, Any, Any], step: Any,
                 ctx: contextvars.Context) -> None:
        self.coro, self.step, self.ctx = coro, step, ctx

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, step, run = self.coro, self.step, self.ctx.run
        while True:
            try:
                sent = yield step
            except GeneratorExit:
                run(coro.close)
                raise
            except BaseException as exc:  # noqa: BLE001 - thrown into the coroutine
                try:
                    step = run(coro.throw, exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    step = run(coro.send, sent)
                except StopIteration as stop:
                    return stop.value
