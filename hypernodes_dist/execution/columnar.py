"""The columnar strategy of the batch executor: node by node over a whole batch.

Acyclic plans (``Plan.columnar``) run here: one C-level ``map`` per sync node, one
``gather`` per async node, branch and gate decisions kept per item. Cache keys chain (a
produced value's id is the key of the run that produced it), so a warm batch of a plan
without decisions computes every key up front and fetches only the outputs it returns;
finished calls reach the cache as they complete (see ``keys.WriteBuffer``). Events are
reported in columns: one ``BatchEvent`` per batch, each call timed at C level (``Clock``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import repeat
from operator import is_
from typing import Any

from hypernodes_dist.cache.hashing import UnhashableValueError
from hypernodes_dist.cache.keys import Keys, WriteBuffer, scope_token
from hypernodes_dist.errors import annotate, portable
from hypernodes_dist.events import BatchEvent, Event, NodeColumns, NodeErrorEvent
from hypernodes_dist.execution.cacheview import CacheView
from hypernodes_dist.execution.calls import Clock, ColumnCalls, Persist
from hypernodes_dist.execution.context import worker_id
from hypernodes_dist.execution.guard import Guard
from hypernodes_dist.execution.invoke import split_outputs
from hypernodes_dist.execution.job import HIT, RAN, BatchResult, BatchSettings, Chunk, TimedSpan
from hypernodes_dist.execution.progress import ticker
from hypernodes_dist.execution.scheduler import decision_target
from hypernodes_dist.missing import MISSING
from hypernodes_dist.nodes import END, HyperNode
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.usage import Usage

__all__ = ["Columnar"]



def _first_of_each_key(node_keys: list[str], todo: Sequence[int]
                       ) -> tuple[Sequence[int], dict[int, int]]:
    """Duplicates inside one batch run once: the items to run (the first of each key) and
    ``{duplicate: item it copies}``. Without duplicates (the usual case) no Python work per
    item: one dict built at C speed shows it."""
    if type(todo) is range and todo.step == 1:
        keys = node_keys[todo.start:todo.stop]
    else:
        keys = list(map(node_keys.__getitem__, todo))
    if len(dict.fromkeys(keys)) == len(keys):
        return todo, {}
    first: dict[str, int] = {}
    dupes: dict[int, int] = {}
    run = []
    for i, k in zip(todo, keys):
        if k in first:
            dupes[i] = first[k]
        else:
            first[k] = i
            run.append(i)
    return run, dupes


class Columnar(ColumnCalls):
    """Node-by-node execution of an acyclic plan over one batch.

    Branch and gate decisions are kept per item (``active``): a target runs for the items
    that chose it; a consumer whose produced input is absent for an item uses its default,
    or does not run for that item; an item whose gate chose ``END`` runs no node after it.
    This is the scheduler's semantics for the acyclic plans ``Plan.columnar`` admits.
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
        self.ended: set[int] = set()  # items a gate ENDed: no node after it runs for them
        self.keys = Keys(plan, settings.cache) if settings.cache is not None else None
        self.cache = settings.cache
        self.node_keys: dict[str, list[str]] = {}
        self.src_keys: dict[str, list[str | None]] = {}  # output -> key of the run producing it
        self.input_ids: dict[str, list[str] | str] = {}
        self.events: list[NodeColumns | Event] = []  # the parts of this batch's BatchEvent
        self.timing: dict[str, tuple[Sequence[int], Clock]] = {}  # node -> (positions, times)
        # node -> (positions, spans of calls timed together): history times
        self.times: dict[str, tuple[Sequence[int], list[TimedSpan]]] = {}
        self.guards: dict[str, Guard] = {}  # the guards of the nodes being called
        self.usage: dict[str, dict[int, Usage]] = {}  # node -> item -> what it metered
        self.calls: dict[str, int] = {}  # batch nodes: calls made (others: items that ran)
        self.wanted = set(settings.select or plan.outputs)
        self.need: dict[str, Sequence[int]] | None = None  # set by the demand pass
        self.looked_up: set[str] = set()  # nodes whose hits the demand pass fetched
        self.writes = writes  # the caller flushes it (``keys.batch_writes``)
        self.view = CacheView(self.cache, writes)
        self.started = time.time()
        self.clock = time.time() - time.perf_counter()
        # the progress channel's ticker, and the node being called: (its place, its calls)
        self.ticks = ticker(settings.progress) if settings.progress is not None else None
        self.stage = (0, 1)
        self.metered: Usage = {}  # with a progress channel: what guarded calls metered so far

    async def run(self) -> BatchResult:
        hits: dict[str, dict[int, Any]] = {}
        if self.keys is not None and self.plan.static:
            for node in self.plan.nodes:
                self._precompute_keys(node)
            if not self.settings.want_events:  # events report every node: fetch everything
                hits = self._plan_demand()
        for k, node in enumerate(self.plan.nodes):
            todo = self._todo(node, hits.get(node.name))
            if todo:
                self.stage = (k, len(todo))
                await self._execute(node, todo)
        return self._result()

    def _advance(self, calls: int) -> None:
        """``calls`` of the current node's calls are done: the batch's rows count as done
        in proportion to the nodes behind them (the progress channel; no-op without it)."""
        if self.ticks is not None:
            k, total = self.stage
            done = self.n * (k * total + calls) // (len(self.plan.nodes) * total)
            self.ticks.tick(self.chunk.offset, done, self.metered)

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
                if found:
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
                arg_ids.append(keys.output_ids(pkeys, p))
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
                column = self.values[p]
                found = Keys.column_ids(node, p, column) or [
                    self._item_id(node, p, i, v) for i, v in enumerate(column)]
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
        if type(items) is range and items.step == 1:
            wanted = node_keys[items.start:items.stop]
        else:
            wanted = [node_keys[i] for i in items]
        found = self.view.fetch(node.name, wanted)  # pending writes of this caller, then store
        if not found:  # a cold batch: no Python work per item
            return {}
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
        if failed or hits or self.ended:
            ended = self.ended
            todo = [i for i in need if i not in failed and (not hits or i not in hits)
                    and i not in ended]
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
        dupes: dict[int, int] = {}
        if node_keys is not None:
            hits = self._lookup(node, todo) if node.name not in self.looked_up else {}
            if hits:
                self._store(node, hits, HIT)
                todo = [i for i in todo if i not in hits]
            todo, dupes = _first_of_each_key(node_keys, todo)
        failures = len(self.failed)
        persist = self._persister(node, node_keys) if node_keys is not None else None
        results = await self._call(node, todo, persist)
        if len(todo) == self.n and len(self.failed) == failures and self._store_all(node, results):
            return
        done = {i: v for i, v in zip(todo, results) if v is not MISSING}
        self._store(node, done, RAN)
        if dupes:
            self._store(node, {i: done[j] for i, j in dupes.items() if j in done}, HIT)

    def _persister(self, node: HyperNode, node_keys: list[str]) -> Persist:
        """Hands finished results to the write buffer as they complete (crash-safe batches);
        no Python work per result unless some item failed."""
        writes = self.writes
        assert writes is not None
        name = node.name

        def persist(positions: Sequence[int], values: Sequence[Any]) -> None:
            if type(positions) is range and positions.step == 1:
                keys: Sequence[str] = node_keys[positions.start:positions.stop]
            else:
                keys = list(map(node_keys.__getitem__, positions))
            if any(map(is_, values, repeat(MISSING))):
                kept = [(k, v) for k, v in zip(keys, values) if v is not MISSING]
                writes.extend([k for k, _ in kept], [v for _, v in kept], name)
            else:
                writes.extend(keys, values, name)

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
            if target is END:
                self.ended.add(i)
            else:
                self.active[target].add(i)
            decided[i] = value
        return decided

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
            starts, ends, {o: self.values[o] for o in node.outputs},
            self._usage_of(node.name, items) if code == RAN else None))

    def _usage_of(self, name: str, items: Sequence[int]) -> list[Usage | None] | None:
        """What each of ``items`` metered in its call of ``name`` (``None``: nothing)."""
        kept = self.usage.get(name)
        return None if not kept else [kept.get(i) for i in items]

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
        times = dict(self.times)
        for name, (positions, clock) in self.timing.items():
            times[name] = (positions, [TimedSpan(0, len(positions), 0.0, 0.0, clock)])
        result.times, result.clock, result.started = times, self.clock, self.started
        result.node_outputs = {node.name: node.outputs for node in self.plan.nodes}
        result.usage, result.calls = self.usage, self.calls
        if self.settings.want_events:
            result.events = [self._batch_event()]
        return result

    def _batch_event(self) -> BatchEvent:
        s = self.settings
        return BatchEvent(
            session_id=s.session_id, run_id=s.run_prefix, offset=self.chunk.offset, n=self.n,
            graph_id=self.plan.graph_hash, started_at=self.started, ended_at=time.time(),
            clock=self.clock, errors=dict(self.failed), worker=worker_id(), parts=self.events)
