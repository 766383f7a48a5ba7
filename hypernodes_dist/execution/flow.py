"""The item-flow strategy: every item walks the plan on its own, no batch barriers.

Acyclic plans that wait on the outside world (``Plan.flows``: async nodes, or nodes whose
policy waits: back-off, limits, timeouts) run here. Each item is a task that runs the
plan's nodes in order, so an item that waits (throttled, retrying, slow) holds back no
other item's downstream nodes: the others run on, and the next items start in its place.
At most ``window`` items are in flight; an item sleeping in a retry back-off gives its
place back (``guard.WINDOW``) so waiting never starves the limits.

Everything else is the columnar strategy's (this class extends ``Columnar``): the value
columns, branch/gate decisions per item, chained cache keys (precomputed for static plans,
with their hits fetched in one lookup per node), failures, results and the batch's
``BatchEvent`` (each node's executions as ``NodeColumns``, built when the batch ends).

``drive`` starts items in order under one window; ``run`` drives one batch (a Dask task,
a Daft UDF call), and the local engine drives many batches under one window
(``engines/local.py``), so the calls of the next batch are in flight while a batch ends.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Callable, Iterable
from typing import Any

from hypernodes_dist.cache.keys import WriteBuffer, scope_token
from hypernodes_dist.events import NodeColumns
from hypernodes_dist.execution.batching import fill, item_window
from hypernodes_dist.execution.calls import Clock
from hypernodes_dist.execution.columnar import Columnar
from hypernodes_dist.execution.context import PARENT, worker_id
from hypernodes_dist.execution.guard import WINDOW, timed_call
from hypernodes_dist.execution.invoke import split_outputs
from hypernodes_dist.execution.job import HIT, RAN, BatchResult, BatchSettings, Chunk, TimedSpan
from hypernodes_dist.missing import MISSING
from hypernodes_dist.nodes import HyperNode
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.usage import NODE, node_total

__all__ = ["ItemFlow", "drive"]


class ItemFlow(Columnar):
    """One batch of items, each walking the plan on its own (see the module docstring)."""

    def __init__(
        self, plan: Plan, chunk: Chunk, settings: BatchSettings, writes: WriteBuffer | None
    ) -> None:
        super().__init__(plan, chunk, settings, writes)
        self.pending = chunk.n  # items not finished yet
        for node in plan.nodes:  # one guard per node for the whole batch
            if node.guarded:
                self._guard(node)
        self.totals = {n.name: node_total(n.name) for n in plan.nodes}  # unguarded metering
        self.prefetched: dict[str, dict[int, Any]] = {}
        self.ran: dict[str, tuple[list[int], array[float], array[float]]] = {}
        self.hit_items: dict[str, list[int]] = {}
        self.last = (0.0, 0.0)  # the timing of the call being stored
        self.required = {  # produced inputs without a default: absent -> the node is skipped
            n.name: tuple(p for p in n.params
                          if p in plan.producers and p not in n.defaults) for n in plan.nodes
        }
        self.token = None
        self.view.running = {}  # keys in flight: identical items wait for the first
        if self.keys is not None:
            self.token = scope_token(self.keys.scope, settings.session_id, "")
            if plan.static:
                for node in plan.nodes:
                    self._precompute_keys(node)
                for name in self.node_keys:  # one lookup per node for the whole batch
                    self.prefetched[name] = self._lookup(plan.by_name[name], range(self.n))

    async def run(self) -> BatchResult:
        """Every item of the batch, at most ``settings.concurrency`` (default: all) at once."""
        calls = self.settings.concurrency
        window = asyncio.Semaphore(item_window(self.plan, calls) if calls else self.n)
        await drive(((self, i) for i in range(self.n)), window)
        return self.finish()

    # -- one item --------------------------------------------------------------------------
    async def item(self, i: int) -> None:
        """Item ``i`` through every node it takes part in, in plan order."""
        failed, ended = self.failed, self.ended
        try:
            for node in self.plan.nodes:
                if i in failed or i in ended:
                    return
                if self._takes_part(node, i):
                    await self._step(node, i)
        finally:
            self.pending -= 1
            if self.ticks is not None:
                self.ticks.tick(self.chunk.offset, self.n - self.pending, self.metered)

    def _takes_part(self, node: HyperNode, i: int) -> bool:
        active = self.active.get(node.name)
        if active is not None and i not in active:
            return False
        values = self.values
        for p in self.required[node.name]:
            col = values.get(p)
            if col is None or col[i] is MISSING:
                return False
        return True

    async def _step(self, node: HyperNode, i: int) -> None:
        key = None
        if self.keys is not None and self.keys.cacheable(node):
            key = self._key_of(node, i)
            value = self._cached(node, i, key)
            if value is MISSING:  # an identical item may be computing it
                value = await self.view.in_flight(key)
            if value is not MISSING:
                self._put(node, i, value, HIT)
                return
        shared = key is not None and node.kind == "function" and bool(node.outputs)
        if shared:  # not decisions
            self.view.begin(key)  # type: ignore[arg-type]
        try:
            await self._compute(node, i, key)
        finally:
            if shared:
                self.view.end(key, self._value_of(node, i))  # type: ignore[arg-type]

    def _value_of(self, node: HyperNode, i: int) -> Any:
        """What item ``i``'s execution of ``node`` produced (``MISSING``: it failed)."""
        if i in self.failed or self.codes[node.name][i] != RAN:
            return MISSING
        outputs = [self.values[o][i] for o in node.outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    async def _compute(self, node: HyperNode, i: int, key: str | None) -> None:
        kwargs = self._kwargs(node, i)
        guard = self.guards.get(node.name)
        nested = None
        if node.nests:  # inner runs are children of the item's run (events, cache, session)
            nested = PARENT.set(self._parent(i))
        t1 = None
        metered = NODE.set(self.totals[node.name])
        try:
            if node.batch_size is not None:  # the item joins a shared call (batching.py)
                value, t0, t1 = await fill(node, kwargs, guard, self.chunk.offset + i, key,
                                          self.settings.run_prefix)
            else:
                value, t0 = await timed_call(node, kwargs, guard, self.chunk.offset + i)
        except Exception as exc:
            self._record_failure(node, i, exc)
            return
        finally:
            NODE.reset(metered)
            if nested is not None:
                PARENT.reset(nested)
        self.last = (t0, t1 or time.perf_counter())
        self._timed(node.name, i, *self.last)
        if key is not None:
            self.view.write(node.name, key, value)
        self._put(node, i, value, RAN)

    def _put(self, node: HyperNode, i: int, value: Any, code: int) -> None:
        """``Columnar._store`` for one item, in O(1) (that one makes a column per call)."""
        if node.targets:  # a decision: no output column
            self._store(node, {i: value}, code)
            return
        outputs = node.outputs
        if len(outputs) == 1:
            parts: Any = (value,)
        else:
            try:
                parts = split_outputs(node, value)
            except Exception as exc:
                self._record_failure(node, i, exc)
                return
        node_keys = self.node_keys.get(node.name)
        src_key = node_keys[i] if node_keys is not None else None
        values = self.values
        for name, part in zip(outputs, parts):
            col = values.get(name)
            if col is None:
                col = values[name] = [MISSING] * self.n
            col[i] = part
            self._src_column(name)[i] = src_key
        self.codes[node.name][i] = code
        if self.settings.want_events:
            self._node_columns(node, (i,), code)

    def _kwargs(self, node: HyperNode, i: int) -> dict[str, Any]:
        values, consts, defaults = self.values, self.consts, node.defaults
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

    # -- cache keys, one item at a time ----------------------------------------------------
    def _key_of(self, node: HyperNode, i: int) -> str:
        node_keys = self.node_keys.get(node.name)
        if node_keys is not None and node_keys[i] is not None:
            return node_keys[i]
        key = self._item_key(node, i)
        if node_keys is None:
            node_keys = self.node_keys[node.name] = [None] * self.n  # type: ignore[list-item]
        node_keys[i] = key
        return key

    def _item_key(self, node: HyperNode, i: int) -> str:
        """Item ``i``'s key of ``node``: the scheduler's chaining (a produced value's id is
        its producer's key; its content hash when the producer is not cacheable)."""
        keys = self.keys
        assert keys is not None
        ids = []
        for p in node.params:
            if p not in self.plan.producers:
                given = self._given_ids(node, p)
                ids.append(given if isinstance(given, str) else given[i])
                continue
            col = self.values.get(p)
            value = MISSING if col is None else col[i]
            src = self.src_keys.get(p)
            k = None if src is None else src[i]
            if k is not None:
                ids.append(keys.output_id(k, p))
            elif value is MISSING:
                ids.append(keys.default_id(node, p))
            else:
                ids.append(self._item_id(node, p, i, value))
        token = self.settings.run_id(self.chunk.offset + i) if keys.scope == "run" else self.token
        return keys.key(node, ids, token)

    def _cached(self, node: HyperNode, i: int, key: str) -> Any:
        found = self.prefetched.get(node.name)
        if found is not None:
            value = found.pop(i, MISSING)
            if value is not MISSING:
                return value
        if not key:
            return MISSING
        if found is not None:  # the cache was read for the whole batch already
            return self.view.pending(node.name, key)  # an identical item finished it
        return self.view.get(node.name, key)

    # -- events ----------------------------------------------------------------
    def _node_columns(self, node: HyperNode, items: Any, code: int) -> None:
        if not items:
            return
        if code == HIT:
            self.hit_items.setdefault(node.name, []).extend(items)
            return
        # executions are timed into ``ran`` as they finish, events or not (``_timed``)

    def _timed(self, name: str, i: int, start: float, end: float) -> None:
        """Item ``i``'s call of ``name`` ran from ``start`` to ``end`` (events and history)."""
        ran = self.ran.get(name)
        if ran is None:
            ran = self.ran[name] = ([], array("d"), array("d"))
        ran[0].append(i)
        ran[1].append(start)
        ran[2].append(end)

    def finish(self) -> BatchResult:
        """The batch's ``BatchResult`` (its executions as ``NodeColumns``, in item order)."""
        for node in self.plan.nodes:  # what the calls metered, per item
            self._harvest(node, self.totals[node.name])
        if self.settings.want_events:
            for node in self.plan.nodes:
                self._columns_of(node)
        for name, (positions, starts, ends) in self.ran.items():  # the items' history
            clock = Clock()
            clock.starts, clock.ends = starts, ends
            self.times[name] = (positions, [TimedSpan(0, len(positions), 0.0, 0.0, clock)])
        result = self._result()
        result.worker, result.run_prefix = worker_id(), self.settings.run_prefix
        return result

    def _columns_of(self, node: HyperNode) -> None:
        name, step = node.name, self.plan.position[node.name]
        outputs = {o: self.values.get(o, [MISSING] * self.n) for o in node.outputs}
        ran = self.ran.get(name)
        if ran is not None:
            order = sorted(range(len(ran[0])), key=ran[0].__getitem__)
            items = [ran[0][k] for k in order]
            self.events.append(NodeColumns(
                name, step, node.tags, node.kind, False, items,
                array("d", (ran[1][k] for k in order)), array("d", (ran[2][k] for k in order)),
                outputs, self._usage_of(name, items)))
        hits = self.hit_items.get(name)
        if hits:
            self.events.append(NodeColumns(name, step, node.tags, node.kind, True, sorted(hits),
                                           None, None, outputs))


async def drive(items: Iterable[tuple[ItemFlow, int]], window: asyncio.Semaphore,
                on_done: Callable[[ItemFlow], Any] | None = None) -> None:
    """Start each ``(flow, item)`` in order, at most ``window`` in flight; ``on_done(flow)``
    after each item. The first error (``on_error="raise"``) cancels the rest and is raised."""
    tasks: set[asyncio.Task[None]] = set()
    failure: list[BaseException] = []
    idle = asyncio.Event()  # set when no item runs any more, or one failed

    async def one(flow: ItemFlow, i: int) -> None:
        WINDOW.set(window)
        try:
            await flow.item(i)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            failure.append(exc)
            idle.set()
            return
        finally:
            window.release()
        if on_done is not None and not failure:
            on_done(flow)

    def forget(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if not tasks:
            idle.set()

    try:
        for flow, i in items:
            await window.acquire()
            if failure:
                window.release()
                break
            task = asyncio.ensure_future(one(flow, i))
            tasks.add(task)
            task.add_done_callback(forget)
        while tasks and not failure:
            idle.clear()
            await idle.wait()
    finally:
        if tasks:  # an error, or the caller was cancelled: stop the items still running
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    if failure:
        raise failure[0]
