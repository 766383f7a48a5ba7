"""The columnar strategy of the batch executor: node by node over a whole batch.

Acyclic plans (``Plan.columnar``) run here: one C-level ``map`` per sync node, one
``gather`` per async node, branch and gate decisions kept per item. Cache keys chain (a
produced value's id is the key of the run that produced it), so a warm batch of a plan
without decisions computes every key up front and fetches only the outputs it returns;
finished calls reach the cache as they complete (see ``keys.WriteBuffer``). Events are
reported in columns: one ``BatchEvent`` per batch, each call timed at C level (``_Clock``).
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

from hypernodes_dist.cache.hashing import UnhashableValueError
from hypernodes_dist.cache.keys import FLUSH_SECONDS, Keys, WriteBuffer, scope_token
from hypernodes_dist.errors import annotate, portable
from hypernodes_dist.events import BatchEvent, Event, NodeColumns, NodeErrorEvent
from hypernodes_dist.execution.context import PARENT, Parent, worker_id
from hypernodes_dist.execution.guard import Guard
from hypernodes_dist.execution.invoke import call_node, join_chunks, split_outputs
from hypernodes_dist.execution.job import HIT, RAN, BatchResult, BatchSettings, Chunk
from hypernodes_dist.execution.scheduler import decision_target
from hypernodes_dist.nodes import END, HyperNode
from hypernodes_dist.plan import MISSING, Plan

__all__ = ["Columnar"]

PERSIST_SLICE = 64  # at most this many cacheable sync calls between two hand-overs
Persist = Callable[[Sequence[int], Sequence[Any]], None]


class Columnar:
    """Node-by-node execution of an acyclic plan over one batch.

    Branch and gate decisions are kept per item (``active``): a target runs for the items
    that chose it; a consumer whose produced input is absent for an item uses its default,
    or does not run for that item. This is the scheduler's semantics for acyclic graphs
    whose gates cannot ``END`` (the plans ``Plan.columnar`` admits).
    """

    def __init__(
        self, plan: Plan, chunk: Chunk, settings: BatchSettings, writes: WriteBuffer | None
    ) -> None:
        self.plan, self.chunk, self.settings = plan, chunk, settings
        self.n = chunk.n
        self.values: dict[str, list[Any]] = {k: list(v) for k, v in chunk.columns.items()}
        self.consts: dict[str, Any] = dict(chunk.broadcast)
        self.failed: dict[int, BaseException] = {}
        self.codes = {node.name: bytearray(self.n) for node in plan.nodes}
        self.active: dict[str, set[int]] = {t: set() for t in plan.gated}
        self.keys = Keys(plan, settings.cache) if settings.cache is not None else None
        self.cache = settings.cache
        self.node_keys: dict[str, list[str]] = {}
        self.src_keys: dict[str, list[str | None]] = {}  # output -> key of the run producing it
        self.input_ids: dict[str, list[str] | str] = {}
        self.events: list[NodeColumns | Event] = []  # the parts of this batch's BatchEvent
        self.timing: dict[str, tuple[Sequence[int], _Clock]] = {}  # node -> (positions, times)
        self.wanted = set(settings.select or plan.outputs)
        self.need: dict[str, Sequence[int]] | None = None  # set by the demand pass
        self.looked_up: set[str] = set()  # nodes whose hits the demand pass fetched
        self.writes = writes  # the caller flushes it (``keys.batch_writes``)
        self.started = time.time()
        self.clock = time.time() - time.perf_counter()

    async def run(self) -> BatchResult:
        hits: dict[str, dict[int, Any]] = {}
        if self.keys is not None and self.plan.static:
            for node in self.plan.nodes:
                self._precompute_keys(node)
            if not self.settings.want_events:  # events report every node: fetch everything
                hits = self._plan_demand()
        for node in self.plan.nodes:
            todo = self._todo(node, hits.get(node.name))
            if todo:
                await self._execute(node, todo)
        return self._result()

    # -- demand: which items must resolve each node (chained keys make warm runs cheap) -----
    def _plan_demand(self) -> dict[str, dict[int, Any]]:
        """Backward pass: fetch the cached outputs that are needed, mark what must execute."""
        plan, keys = self.plan, self.keys
        assert keys is not None
        every = range(self.n)
        requested: dict[str, set[int]] = {}
        self.need = {}
        hits: dict[str, dict[int, Any]] = {}
        for node in reversed(plan.nodes):
            name = node.name
            if not keys.cacheable(node) or any(o in self.wanted for o in node.outputs):
                need: Sequence[int] = every
            else:
                need = sorted(set().union(*(requested.get(o, set()) for o in node.outputs)))
            self.need[name] = need
            run: Sequence[int] = need
            if name in self.node_keys and need:
                found = self._lookup(node, need)
                hits[name] = found
                self.looked_up.add(name)
                run = [i for i in need if i not in found]
            for p in node.params:
                if p in plan.producers:
                    requested.setdefault(p, set()).update(run)
        return hits

    def _precompute_keys(self, node: HyperNode) -> None:
        """Keys known before anything runs: inputs hashed, produced values chained."""
        keys = self.keys
        assert keys is not None
        if not keys.cacheable(node):
            return
        arg_ids: list[list[str] | str] = []
        for p in node.params:
            if p in self.plan.producers:
                pkeys = self.node_keys.get(self.plan.producers[p][0])  # static: one producer
                if pkeys is None:
                    return  # downstream of a non-cacheable node: keyed when it runs
                arg_ids.append([keys.output_id(k, p) for k in pkeys])
            else:
                arg_ids.append(self._given_ids(node, p))
        self.node_keys[node.name] = self._keys_for(node, arg_ids)

    def _given_ids(self, node: HyperNode, p: str) -> list[str] | str:
        """Ids of a graph input: one per item (mapped), one for all (broadcast), or default."""
        found = self.input_ids.get(p)
        if found is None:
            keys = self.keys
            assert keys is not None
            if p in self.consts:
                found = keys.input_id(node, p, self.consts[p])
            elif p in self.values:
                found = [self._item_id(node, p, i, v) for i, v in enumerate(self.values[p])]
            else:
                return keys.default_id(node, p)
            self.input_ids[p] = found
        return found

    def _current_keys(self, node: HyperNode) -> list[str]:
        """Keys from what has run: a produced value's id chains the key of the run that
        produced it (content hash when that node is not cacheable), as the scheduler does."""
        keys = self.keys
        assert keys is not None
        arg_ids: list[list[str] | str] = []
        for p in node.params:
            if p not in self.plan.producers:
                arg_ids.append(self._given_ids(node, p))
                continue
            values = self.values.get(p, [MISSING] * self.n)
            src = self.src_keys.get(p, [None] * self.n)
            absent = keys.default_id(node, p) if p in node.defaults else ""
            arg_ids.append([
                keys.output_id(k, p) if k is not None
                else absent if v is MISSING else self._item_id(node, p, i, v)
                for i, (k, v) in enumerate(zip(src, values))
            ])
        return self._keys_for(node, arg_ids)

    def _item_id(self, node: HyperNode, p: str, i: int, value: Any) -> str:
        """Id of item ``i``'s value of ``p``; an unhashable one fails that item ("" stands in)."""
        try:
            return Keys.input_id(node, p, value)
        except UnhashableValueError as exc:
            if i not in self.failed:
                self._record_failure(node, i, exc)
            return ""

    def _keys_for(self, node: HyperNode, arg_ids: list[Any]) -> list[str]:
        keys, s = self.keys, self.settings
        assert keys is not None
        if keys.scope == "run":
            tokens: Any = [s.run_id(self.chunk.offset + i) for i in range(self.n)]
        else:
            tokens = scope_token(keys.scope, s.session_id, "")
        return keys.column_keys(node, arg_ids, self.n, tokens)

    def _lookup(self, node: HyperNode, items: Sequence[int]) -> dict[int, Any]:
        node_keys = self.node_keys[node.name]
        wanted = [node_keys[i] for i in items]
        found = self.cache.get_many(wanted)
        return {i: found[k] for i, k in zip(items, wanted) if k in found}

    def _todo(self, node: HyperNode, hits: dict[int, Any] | None) -> Sequence[int]:
        """Items that must execute ``node``: needed, not failed, activated if it is a target,
        and holding every produced input it has no default for."""
        need: Sequence[int] = range(self.n) if self.need is None else self.need[node.name]
        if node.name in self.active:
            need = sorted(self.active[node.name].intersection(need))
        if hits:
            self._store(node, hits, HIT)
        failed = self.failed
        todo: Sequence[int] = need  # a range while every item takes part: no int per item
        if failed or hits:
            todo = [i for i in need if i not in failed and (not hits or i not in hits)]
        if self.plan.static:
            return todo
        for p in node.params:
            if p in self.plan.producers and p not in node.defaults:
                column = self.values.get(p)
                todo = [] if column is None else [i for i in todo if column[i] is not MISSING]
        return todo

    # -- execution -----------------------------------------------------------------------
    async def _execute(self, node: HyperNode, todo: Sequence[int]) -> None:
        keys = self.keys
        if keys is not None and keys.cacheable(node) and node.name not in self.node_keys:
            self.node_keys[node.name] = self._current_keys(node)
        node_keys = self.node_keys.get(node.name)
        first: dict[str, int] = {}
        dupes: dict[int, int] = {}
        if node_keys is not None:
            hits = self._lookup(node, todo) if node.name not in self.looked_up else {}
            if hits:
                self._store(node, hits, HIT)
                todo = [i for i in todo if i not in hits]
            run = []
            for i in todo:  # duplicates inside one batch run once
                k = node_keys[i]
                if k in first:
                    dupes[i] = first[k]
                else:
                    first[k] = i
                    run.append(i)
            todo = run
        failures = len(self.failed)
        persist = self._persister(node_keys) if node_keys is not None else None
        results = await self._call(node, todo, persist)
        if len(todo) == self.n and len(self.failed) == failures and self._store_all(node, results):
            return
        done = {i: v for i, v in zip(todo, results) if v is not MISSING}
        self._store(node, done, RAN)
        if dupes:
            self._store(node, {i: done[j] for i, j in dupes.items() if j in done}, HIT)

    def _persister(self, node_keys: list[str]) -> Callable[[Sequence[int], Sequence[Any]], None]:
        """Hands finished results to the write buffer as they complete (crash-safe batches)."""
        writes = self.writes
        assert writes is not None

        def persist(positions: Sequence[int], values: Sequence[Any]) -> None:
            writes.update((node_keys[i], v) for i, v in zip(positions, values) if v is not MISSING)

        return persist

    def _store_all(self, node: HyperNode, results: list[Any]) -> bool:
        """Fast path: every item of the batch ran and none failed; whole columns at once."""
        if node.targets:
            return False
        outputs = node.outputs
        if len(outputs) > 1:
            width = len(outputs)
            if not all(type(v) in (tuple, list) and len(v) == width for v in results):
                return False  # the per-item path reports the malformed items
            for name, column in zip(outputs, zip(*results)):
                self.values[name] = list(column)
        elif outputs:
            self.values[outputs[0]] = results
        node_keys = self.node_keys.get(node.name)
        for name in outputs:
            if node_keys is not None:
                self.src_keys[name] = node_keys  # type: ignore[assignment]
            else:
                self.src_keys.pop(name, None)
        self.codes[node.name] = bytearray(b"\x01") * self.n
        if self.settings.want_events:
            self._node_columns(node, self.timing[node.name][0], RAN)  # every item, in order
        return True

    def _store(self, node: HyperNode, results: dict[int, Any], code: int) -> None:
        if node.targets:
            results = self._decide(node, results)
        codes = self.codes[node.name]
        outputs = node.outputs
        cols = [self.values.setdefault(o, [MISSING] * self.n) for o in outputs]
        node_keys = self.node_keys.get(node.name)
        srcs = [self._src_column(o) for o in outputs]
        single = len(outputs) == 1
        for i, value in results.items():
            if single:
                cols[0][i] = value
            elif outputs:
                try:
                    parts = split_outputs(node, value)
                except Exception as exc:
                    self._record_failure(node, i, exc)
                    continue
                for col, part in zip(cols, parts):
                    col[i] = part
            for src in srcs:
                src[i] = node_keys[i] if node_keys is not None else None
            codes[i] = code
        if self.settings.want_events:
            failed = self.failed
            self._node_columns(node, [i for i in results if i not in failed], code)

    def _src_column(self, output: str) -> list[str | None]:
        src = self.src_keys.get(output)
        if src is None:
            src = self.src_keys[output] = [None] * self.n
        elif len(self.plan.producers[output]) == 1 and src is self.node_keys.get(
                self.plan.producers[output][0]):
            src = self.src_keys[output] = list(src)  # never write into a node's key list
        return src

    def _decide(self, node: HyperNode, results: dict[int, Any]) -> dict[int, Any]:
        """Activate each item's chosen target; a bad decision fails that item."""
        decided = {}
        for i, value in results.items():
            try:
                target = decision_target(node, value)
            except Exception as exc:
                self._record_failure(node, i, exc)
                continue
            if target is not END:
                self.active[target].add(i)
            decided[i] = value
        return decided

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
        if not todo:
            return []
        fn = _positional(node)
        guard = self._guard(node) if node.policy is not None else None  # policies.py
        if node.is_async or (node.streaming and not node.is_generator):
            return await self._call_async(node, todo, guard, persist)
        if guard is not None:
            fn = guard.positional(fn, [self.chunk.offset + i for i in todo])
        clock = None
        if self.settings.want_events:
            clock = _Clock()
            self.timing[node.name] = (todo, clock)
            if node.nests:  # its inner runs report as children of the item's run
                fn, clock = self._nesting(fn, todo, clock), None
        its = self._args(node, todo)
        if persist is None:
            return self._map(node, fn, its, todo, [], clock)
        out: list[Any] = []
        start, size = 0, 1
        while start < len(todo):  # persist as slices finish; slices adapt to the call time
            stop = min(start + size, len(todo))
            t0 = time.monotonic()
            try:
                self._map(node, fn, [islice(it, stop - start) for it in its], todo, out, clock)
            finally:  # even on Ctrl-C: what finished in this slice is kept
                persist(todo[start:len(out)], out[start:])
            quick = time.monotonic() - t0 < FLUSH_SECONDS / 4
            size = min(size * 2, PERSIST_SLICE) if quick else max(1, size // 2)
            start = stop
        return out

    def _map(self, node: HyperNode, fn: Callable[..., Any], its: list[Iterator[Any]],
             todo: Sequence[int], out: list[Any], clock: _Clock | None = None) -> list[Any]:
        """Call ``fn`` over the argument iterators into ``out``; a failing call marks its item
        and the loop resumes after it (C-level ``map``: no per-item Python overhead)."""
        while True:
            try:
                if clock is None:
                    out.extend(map(fn, *its))
                else:
                    clock.run(fn, its, out)
                return out
            except Exception as exc:
                self._record_failure(node, todo[len(out)], exc)
                out.append(MISSING)

    async def _call_async(self, node: HyperNode, todo: Sequence[int], guard: Any = None,
                          persist: Persist | None = None) -> list[Any]:
        its = self._args(node, todo)
        limit = self.settings.concurrency or len(todo)
        plain = guard is None and persist is None and not self.settings.want_events
        if plain and node.is_async and not node.streaming and len(todo) <= limit:
            return self._gathered(node, todo, await asyncio.gather(
                *map(_positional(node), *its), return_exceptions=True))
        sem = asyncio.Semaphore(limit)
        params = node.params

        async def one(args: tuple[Any, ...], i: int) -> Any:
            if node.nests and self.settings.want_events:  # this task's own context
                PARENT.set(self._parent(i))
            async with sem:
                t0 = time.perf_counter()
                kwargs = dict(zip(params, args)) if params else {}
                if guard is None:
                    value = await call_node(node, kwargs, None)
                else:
                    value = await guard.acall(lambda: call_node(node, kwargs, None),
                                              self.chunk.offset + i)
                if persist is not None:
                    persist((i,), (value,))
                return value, t0, time.perf_counter()

        results = await asyncio.gather(
            *(one(a if params else (), i) for a, i in zip(zip(*its), todo)), return_exceptions=True
        )
        clock = _Clock()
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

    def _nesting(self, fn: Callable[..., Any], todo: Sequence[int], clock: _Clock) -> Callable[..., Any]:
        """``fn`` timed into ``clock``, each call's inner runs reporting to this batch's
        events as children of the item's run."""
        positions = iter(todo)
        now = time.perf_counter

        def nesting(*args: Any) -> Any:
            token = PARENT.set(self._parent(next(positions)))
            start = now()
            try:
                return fn(*args)
            finally:
                clock.add((start,), (now(),))
                PARENT.reset(token)

        return nesting

    def _parent(self, i: int) -> Parent:
        s = self.settings
        return Parent(self.events.append, s.session_id, s.run_id(self.chunk.offset + i))

    def _guard(self, node: HyperNode) -> Any:
        """The node's call policy for this batch; ``PolicyEvent``s join the batch's events."""
        report = None
        if self.settings.want_events:
            s, events = self.settings, self.events

            def report(event: Any) -> None:
                event.session_id, event.run_id = s.session_id, s.run_id(event.item_index)
                event.step_index = self.plan.position[node.name]
                events.append(event)

        return Guard(node, report)

    def _record_failure(self, node: HyperNode, i: int, exc: BaseException) -> None:
        index = self.chunk.offset + i
        annotate(exc, node.name, index)
        if self.settings.on_error == "raise":
            raise exc
        self.failed[i] = portable(exc)
        if self.settings.want_events:
            self.events.append(NodeErrorEvent(
                session_id=self.settings.session_id, run_id=self.settings.run_id(index),
                node_id=node.name, tags=node.tags, item_index=index, error=self.failed[i],
                attempts=getattr(exc, "hn_attempts", 1),
            ))

    # -- events & result -------------------------------------------------------------------
    def _node_columns(self, node: HyperNode, items: Sequence[int], code: int) -> None:
        if not items:
            return
        starts = ends = None
        if code == RAN:
            positions, clock = self.timing[node.name]
            starts, ends = clock.starts, clock.ends
            if positions is not items and list(positions) != list(items):
                where = dict(zip(positions, range(len(positions))))
                starts = [starts[where[i]] for i in items]
                ends = [ends[where[i]] for i in items]
        self.events.append(NodeColumns(
            node.name, self.plan.position[node.name], node.tags, node.kind, code == HIT, items,
            starts, ends, {o: self.values[o] for o in node.outputs}))

    def _result(self) -> BatchResult:
        wanted = self.settings.select or self.plan.outputs
        n = self.n
        outputs = {k: self.values.get(k, [MISSING] * n) for k in wanted}
        if self.failed:  # copies: the batch event's columns keep what each node produced
            outputs = {k: list(col) for k, col in outputs.items()}
            for i in self.failed:
                for col in outputs.values():
                    col[i] = MISSING
        executed = sum(c.count(RAN) for c in self.codes.values())
        hits = sum(c.count(HIT) for c in self.codes.values())
        result = BatchResult(
            self.chunk.offset, n, outputs, dict(self.failed), tuple(n.name for n in self.plan.nodes),
            self.codes, None, [], executed, hits,
        )
        if self.settings.want_events:
            result.events = [self._batch_event()]
        return result

    def _batch_event(self) -> BatchEvent:
        s = self.settings
        return BatchEvent(
            session_id=s.session_id, run_id=s.run_prefix, offset=self.chunk.offset, n=self.n,
            graph_id=self.plan.graph_hash, started_at=self.started, ended_at=time.time(),
            clock=self.clock, errors=dict(self.failed), worker=worker_id(), parts=self.events)


class _Clock:
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
            return join_chunks(list(inner(*args)))
    return fn
