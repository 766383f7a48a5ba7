"""The columnar strategy of the batch executor: node by node over a whole batch.

Acyclic plans (``Plan.columnar``) run here: one C-level ``map`` per sync node, one
``gather`` per async node, branch and gate decisions kept per item (``active``): a target
runs for the items that chose it; a consumer whose produced input is absent for an item
uses its default, or does not run for that item; an item whose gate chose ``END`` runs no
node after it — the scheduler's semantics for the acyclic plans ``Plan.columnar`` admits.
Cache keys chain (a produced value's id is the key of the run that produced it), so a warm
batch of a plan without decisions computes every key up front and fetches only the
outputs it returns; finished calls reach the cache as they complete (see
``keys.WriteBuffer``). Events are reported in columns: one ``BatchEvent`` per batch, each
call timed at C level (``Clock``). Plain functions over the batch's ``BatchState``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import is_
from typing import Any

from hypernodes_dist.cache.keys import WriteBuffer
from hypernodes_dist.events import NodeColumns
from hypernodes_dist.execution.batchkeys import (
    given_ids,
    item_id,
    keys_for,
    lookup,
    precompute_keys,
)
from hypernodes_dist.execution.calls import Persist, call
from hypernodes_dist.execution.job import HIT, RAN, BatchSettings, Chunk, ColumnarResult
from hypernodes_dist.execution.state import BatchState, build_result, new_state, store, usage_of
from hypernodes_dist.missing import MISSING
from hypernodes_dist.nodes import HyperNode
from hypernodes_dist.plan import Plan

__all__ = ["run_columnar", "node_columns"]


async def run_columnar(plan: Plan, chunk: Chunk, settings: BatchSettings,
                       writes: WriteBuffer | None) -> ColumnarResult:
    """Every node of ``plan`` over every item of ``chunk`` that takes part, in plan order."""
    st = new_state(plan, chunk, settings, writes)
    st.record = node_columns
    hits: dict[str, dict[int, Any]] = {}
    if st.keys is not None and plan.static:
        for node in plan.nodes:
            precompute_keys(st, node)
        if not settings.want_events:  # events report every node: fetch everything
            hits = _plan_demand(st)
    for k, node in enumerate(plan.nodes):
        todo = _todo(st, node, hits.get(node.name))
        if todo:
            st.stage = (k, len(todo))
            await _execute(st, node, todo)
    return build_result(st)


# -- demand: which items must resolve each node (chained keys make warm runs cheap) -------
def _plan_demand(st: BatchState) -> dict[str, dict[int, Any]]:
    """Backward pass: fetch the cached outputs that are needed, mark what must execute."""
    plan, keys = st.plan, st.keys
    assert keys is not None
    every = range(st.n)
    requested: dict[str, set[int]] = {}
    st.need = {}
    hits: dict[str, dict[int, Any]] = {}
    for node in reversed(plan.nodes):
        name = node.name
        if not keys.cacheable(node) or any(o in st.wanted for o in node.outputs):
            need: Sequence[int] = every
        else:
            need = sorted(set().union(*(requested.get(o, set()) for o in node.outputs)))
        st.need[name] = need
        run: Sequence[int] = need
        if name in st.node_keys and need:
            found = lookup(st, node, need)
            hits[name] = found
            st.looked_up.add(name)
            if found:
                run = [i for i in need if i not in found]
        for p in node.params:
            if p in plan.producers:
                requested.setdefault(p, set()).update(run)
    return hits


def _current_keys(st: BatchState, node: HyperNode) -> list[str]:
    """Keys from what has run: a produced value's id chains the key of the run that
    produced it (content hash when that node is not cacheable), as the scheduler does."""
    keys = st.keys
    assert keys is not None
    arg_ids: list[list[str] | str] = []
    for p in node.params:
        if p not in st.plan.producers:
            arg_ids.append(given_ids(st, node, p))
            continue
        values = st.values.get(p, [MISSING] * st.n)
        src = st.src_keys.get(p, [None] * st.n)
        absent = keys.default_id(node, p) if p in node.defaults else ""
        arg_ids.append([
            keys.output_id(k, p) if k is not None
            else absent if v is MISSING else item_id(st, node, p, i, v)
            for i, (k, v) in enumerate(zip(src, values))
        ])
    return keys_for(st, node, arg_ids)


def _todo(st: BatchState, node: HyperNode, hits: dict[int, Any] | None) -> Sequence[int]:
    """Items that must execute ``node``: needed, not failed, activated if it is a target,
    and holding every produced input it has no default for."""
    need: Sequence[int] = range(st.n) if st.need is None else st.need[node.name]
    if node.name in st.active:
        need = sorted(st.active[node.name].intersection(need))
    if hits:
        store(st, node, hits, HIT)
    failed = st.failed
    todo: Sequence[int] = need  # a range while every item takes part: no int per item
    if failed or hits or st.ended:
        ended = st.ended
        todo = [i for i in need if i not in failed and (not hits or i not in hits)
                and i not in ended]
    if st.plan.static:
        return todo
    for p in node.params:
        if p in st.plan.producers and p not in node.defaults:
            column = st.values.get(p)
            todo = [] if column is None else [i for i in todo if column[i] is not MISSING]
    return todo


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


# -- execution -------------------------------------------------------------------------
async def _execute(st: BatchState, node: HyperNode, todo: Sequence[int]) -> None:
    keys = st.keys
    if keys is not None and keys.cacheable(node) and node.name not in st.node_keys:
        st.node_keys[node.name] = _current_keys(st, node)
    node_keys = st.node_keys.get(node.name)
    dupes: dict[int, int] = {}
    if node_keys is not None:
        hits = lookup(st, node, todo) if node.name not in st.looked_up else {}
        if hits:
            store(st, node, hits, HIT)
            todo = [i for i in todo if i not in hits]
        todo, dupes = _first_of_each_key(node_keys, todo)
    failures = len(st.failed)
    persist = _persister(st, node, node_keys) if node_keys is not None else None
    results = await call(st, node, todo, persist)
    if len(todo) == st.n and len(st.failed) == failures and _store_all(st, node, results):
        return
    done = {i: v for i, v in zip(todo, results) if v is not MISSING}
    store(st, node, done, RAN)
    if dupes:
        store(st, node, {i: done[j] for i, j in dupes.items() if j in done}, HIT)


def _persister(st: BatchState, node: HyperNode, node_keys: list[str]) -> Persist:
    """Hands finished results to the write buffer as they complete (crash-safe batches);
    no Python work per result unless some item failed."""
    writes = st.writes
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


def _store_all(st: BatchState, node: HyperNode, results: list[Any]) -> bool:
    """Fast path: every item of the batch ran and none failed; whole columns at once."""
    if node.targets:
        return False
    outputs = node.outputs
    if len(outputs) > 1:
        width = len(outputs)
        if not all(type(v) in (tuple, list) and len(v) == width for v in results):
            return False  # the per-item path reports the malformed items
        for name, column in zip(outputs, zip(*results)):
            st.values[name] = list(column)
    elif outputs:
        st.values[outputs[0]] = results
    node_keys = st.node_keys.get(node.name)
    for name in outputs:
        if node_keys is not None:
            st.src_keys[name] = node_keys  # type: ignore[assignment]  # a node's key list is read as its outputs' source keys, never written
        else:
            st.src_keys.pop(name, None)
    st.codes[node.name] = bytearray(b"\x01") * st.n
    if st.settings.want_events:
        node_columns(st, node, st.timing[node.name][0], RAN)  # every item, in order
    return True


# -- events ----------------------------------------------------------------------------
def node_columns(st: BatchState, node: HyperNode, items: Sequence[int], code: int) -> None:
    """``items``' executions of ``node`` as one ``NodeColumns`` block of the batch event."""
    if not items:
        return
    starts: Sequence[float] | None = None
    ends: Sequence[float] | None = None
    if code == RAN:
        positions, clock = st.timing[node.name]
        starts, ends = clock.starts, clock.ends
        if positions is not items and list(positions) != list(items):
            where = dict(zip(positions, range(len(positions))))
            starts = [starts[where[i]] for i in items]
            ends = [ends[where[i]] for i in items]
    st.events.append(NodeColumns(
        node.name, st.plan.position[node.name], node.tags, node.kind, code == HIT, items,
        starts, ends, {o: st.values[o] for o in node.outputs},
        usage_of(st, node.name, items) if code == RAN else None))
