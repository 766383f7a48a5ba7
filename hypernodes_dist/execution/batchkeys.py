"""A batch's cache keys, a column at a time: chained keys (a produced value's id is the key
of the run that produced it), inputs hashed once per column, hits fetched per column
through the batch's ``CacheView``. Both strategies key through these over ``BatchState``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypernodes_dist.cache.hashing import UnhashableValueError
from hypernodes_dist.cache.keys import Keys, scope_token
from hypernodes_dist.execution.state import BatchState, record_failure
from hypernodes_dist.nodes import HyperNode

__all__ = ["precompute_keys", "given_ids", "item_id", "keys_for", "lookup"]


def precompute_keys(st: BatchState, node: HyperNode) -> None:
    """Keys known before anything runs: inputs hashed, produced values chained."""
    keys = st.keys
    assert keys is not None
    if not keys.cacheable(node):
        return
    arg_ids: list[list[str] | str] = []
    for p in node.params:
        if p in st.plan.producers:
            pkeys = st.node_keys.get(st.plan.producers[p][0])  # static: one producer
            if pkeys is None:
                return  # downstream of a non-cacheable node: keyed when it runs
            arg_ids.append(keys.output_ids(pkeys, p))
        else:
            arg_ids.append(given_ids(st, node, p))
    st.node_keys[node.name] = keys_for(st, node, arg_ids)


def given_ids(st: BatchState, node: HyperNode, p: str) -> list[str] | str:
    """Ids of a graph input: one per item (mapped), one for all (broadcast), or default."""
    found = st.input_ids.get(p)
    if found is None:
        keys = st.keys
        assert keys is not None
        if p in st.consts:
            found = keys.input_id(node, p, st.consts[p])
        elif p in st.values:
            column = st.values[p]
            found = Keys.column_ids(node, p, column) or [
                item_id(st, node, p, i, v) for i, v in enumerate(column)]
        else:
            return keys.default_id(node, p)
        st.input_ids[p] = found
    return found


def item_id(st: BatchState, node: HyperNode, p: str, i: int, value: Any) -> str:
    """Id of item ``i``'s value of ``p``; an unhashable one fails that item ("" stands in)."""
    try:
        return Keys.input_id(node, p, value)
    except UnhashableValueError as exc:
        if i not in st.failed:
            record_failure(st, node, i, exc)
        return ""


def keys_for(st: BatchState, node: HyperNode, arg_ids: list[Any]) -> list[str]:
    """``node``'s key per item from its arguments' ids (a column or one id each)."""
    keys, s = st.keys, st.settings
    assert keys is not None
    if keys.scope == "run":
        tokens: Any = [s.run_id(st.chunk.offset + i) for i in range(st.n)]
    else:
        tokens = scope_token(keys.scope, s.session_id, "")
    return keys.column_keys(node, arg_ids, st.n, tokens)


def lookup(st: BatchState, node: HyperNode, items: Sequence[int]) -> dict[int, Any]:
    """The cached values of ``node`` for ``items`` (pending writes of this caller, then the
    store), by item."""
    node_keys = st.node_keys[node.name]
    if type(items) is range and items.step == 1:
        wanted = node_keys[items.start:items.stop]
    else:
        wanted = [node_keys[i] for i in items]
    found = st.view.fetch(node.name, wanted)
    if not found:  # a cold batch: no Python work per item
        return {}
    return {i: found[k] for i, k in zip(items, wanted) if k in found}
