"""Cache keys of node executions, shared by every executor and every engine's workers.

Keys *chain*: the identity of a value a cacheable node produced is derived from that
node's key (``chain_id(key, output)``), not from the value. A warm run can therefore
compute every key of an item from its inputs alone and fetch only the outputs it returns.
Values from graph inputs, defaults and non-cacheable nodes are identified by their content
hash. A key = hash(code identity, (parameter, value identity) pairs, session/run token);
a node's ``unkeyed`` parameters (inputs of its resources named in ``not_in_key``: a key,
an endpoint) are left out of the pairs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import repeat
from typing import Any, Protocol

from hypernodes_dist.cache.base import Cache
from hypernodes_dist.cache.hashing import (
    UnhashableValueError,
    chain_id,
    chain_ids,
    hash_column,
    hash_value,
    key_from,
    key_prefix,
    keys_from,
)

__all__ = ["Keys", "KeyValues", "KeyedNode", "KeyedPlan", "WriteBuffer", "batch_writes",
           "scope_token", "FLUSH_SECONDS"]

FLUSH_SECONDS = 0.5  # finished work reaches the disk at least this often during a batch


class KeyedNode(Protocol):
    """What keys read of a node (``nodes.HyperNode``; the cache does not import upward)."""

    name: str
    params: tuple[str, ...]
    defaults: dict[str, Any]
    unkeyed: frozenset[str]  # parameters that stay out of its key


class KeyedPlan(Protocol):
    """What keys read of a plan (``plan.Plan``): the code identity of each cacheable node."""

    def code_ids(self) -> dict[str, str]: ...


def scope_token(scope: str, session_id: str, run_id: str) -> str | None:
    """The id a cache scope mixes into every key (none for ``global``)."""
    if scope == "session":
        return session_id
    if scope == "run":
        return run_id
    return None


class Keys:
    """Key arithmetic for one plan and one cache."""

    def __init__(self, plan: KeyedPlan, cache: Cache | None) -> None:
        self.cache = cache
        self.scope = cache.scope if cache is not None else "global"
        self.code_ids = plan.code_ids()
        self._layouts: dict[str, tuple[list[int], list[str]]] = {}
        self._prefixes: dict[tuple[str, str | None], str] = {}
        self._default_ids: dict[tuple[str, str], str] = {}

    def cacheable(self, node: KeyedNode) -> bool:
        return node.name in self.code_ids

    @staticmethod
    def value_id(value: Any) -> str:
        return hash_value(value)

    @staticmethod
    def input_id(node: KeyedNode, param: str, value: Any) -> str:
        """``value_id`` of an argument; an unhashable one names the parameter and the node."""
        try:
            return hash_value(value)
        except UnhashableValueError as exc:
            raise UnhashableValueError(
                f"input {param!r} of node {node.name!r} has no canonical hash for the cache "
                f"key: {exc} (define __hypernodes_hash__ on its type, or cache=False on the node)"
            ) from exc

    def default_id(self, node: KeyedNode, param: str) -> str:
        memo = (node.name, param)
        found = self._default_ids.get(memo)
        if found is None:
            found = self._default_ids[memo] = hash_value(node.defaults[param])
        return found

    def _layout(self, node: KeyedNode) -> tuple[list[int], list[str]]:
        found = self._layouts.get(node.name)
        if found is None:
            perm = sorted((i for i, p in enumerate(node.params) if p not in node.unkeyed),
                          key=lambda i: node.params[i])
            found = self._layouts[node.name] = (perm, [node.params[i] for i in perm])
        return found

    def _prefix(self, node: KeyedNode, token: str | None) -> str:
        memo = (node.name, token)
        found = self._prefixes.get(memo)
        if found is None:
            found = key_prefix(self.code_ids[node.name], self._layout(node)[1], token)
            if self.scope != "run":  # run tokens are unique: memoising them only leaks
                self._prefixes[memo] = found
        return found

    def key(self, node: KeyedNode, arg_ids: Sequence[str], token: str | None) -> str:
        """The key of one execution; ``arg_ids`` in the node's parameter order."""
        perm = self._layout(node)[0]
        return key_from(self._prefix(node, token), [arg_ids[i] for i in perm])

    def column_keys(
        self,
        node: KeyedNode,
        arg_ids: Sequence[Sequence[str] | str],
        n: int,
        tokens: Sequence[str | None] | str | None,
    ) -> list[str]:
        """Keys of ``n`` items at once. Each arg id is one id for every item or a column of
        ``n``; ``tokens`` is one scope token for every item or a column of ``n``."""
        perm = self._layout(node)[0]
        cols = [arg_ids[i] for i in perm]
        rows: Iterable[str]
        if len(cols) == 1 and not isinstance(cols[0], str):
            rows = cols[0]  # one parameter: its ids are the rows (no join per item)
        elif cols:
            rows = map("|".join, zip(*(repeat(c, n) if isinstance(c, str) else c for c in cols)))
        else:
            rows = repeat("", n)
        if tokens is None or isinstance(tokens, str):
            return keys_from(self._prefix(node, tokens), rows)
        return keys_from(map(self._prefix, repeat(node), tokens), rows)

    @staticmethod
    def output_id(key: str, output: str) -> str:
        return chain_id(key, output)

    @staticmethod
    def output_ids(keys: Sequence[str], output: str) -> list[str]:
        """``output_id`` of a column of keys (C-level: no Python work per key)."""
        return chain_ids(keys, output)

    @staticmethod
    def column_ids(node: KeyedNode, param: str, values: Sequence[Any]) -> list[str] | None:
        """``input_id`` of a column of values at C speed; ``None`` if one is unhashable
        (the caller then goes item by item to fail only that item)."""
        try:
            return hash_column(values)
        except UnhashableValueError:
            return None


class KeyValues(Mapping[str, Any]):
    """A read-only mapping over a column of keys and a column of values, built without
    hashing anything: what ``WriteBuffer`` hands to ``Cache.set_many`` (which only walks it).
    A key given twice keeps its last value (content addresses: the same value anyway)."""

    def __init__(self, keys: list[str], values: list[Any]) -> None:
        self._keys, self._values = keys, values
        self._dict: dict[str, Any] | None = None

    def _mapping(self) -> dict[str, Any]:
        if self._dict is None:
            self._dict = dict(zip(self._keys, self._values))
        return self._dict

    def __getitem__(self, key: str) -> Any:
        return self._mapping()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> Any:
        return self._keys

    def values(self) -> Any:
        return self._values

    def items(self) -> Any:
        return zip(self._keys, self._values)


class WriteBuffer:
    """Cache writes of one batch (or of consecutive batches run by one caller), grouped by
    node: one ``set_many`` (one segment, one transaction) per node and flush, yet never more
    than ``FLUSH_SECONDS`` of finished work waiting in memory (a crash loses at most that).
    Results are kept as two columns per node (no dict insert per result)."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.items: dict[str, tuple[list[str], list[Any]]] = {}  # node -> (keys, values)
        self.last = time.monotonic()
        self._index: dict[str, tuple[dict[str, Any], int]] = {}  # see ``pending``

    def _columns(self, node: str) -> tuple[list[str], list[Any]]:
        found = self.items.get(node)
        if found is None:
            found = self.items[node] = ([], [])
        return found

    def add(self, key: str, value: Any, node: str) -> None:
        keys, values = self._columns(node)
        keys.append(key)
        values.append(value)
        self.flush_if_due()

    def extend(self, keys: Iterable[str], values: Iterable[Any], node: str) -> None:
        """Add a column of results of ``node`` (``keys`` and ``values`` aligned)."""
        mine, theirs = self._columns(node)
        mine.extend(keys)
        theirs.extend(values)
        self.flush_if_due()

    def update(self, pairs: Iterable[tuple[str, Any]], node: str) -> None:
        for key, value in pairs:
            self.add(key, value, node)

    def pending(self, node: str) -> dict[str, Any]:
        """``node``'s results not flushed yet, by key: what an identical item of this batch
        (or of a later batch of the same caller) reads instead of computing it again. Indexed
        on demand, from where the last lookup stopped (nothing is paid without lookups)."""
        found = self.items.get(node)
        if not found:
            return {}
        keys, values = found
        index, done = self._index.get(node, ({}, 0))
        if done < len(keys):
            index.update(zip(keys[done:], values[done:]))
            self._index[node] = (index, len(keys))
        return index

    def flush_if_due(self) -> None:
        if self.items and time.monotonic() - self.last >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        groups, self.items, self._index = self.items, {}, {}
        for node, (keys, values) in groups.items():
            if keys:
                self.cache.set_many(KeyValues(keys, values), node=node)
        self.last = time.monotonic()


@contextmanager
def batch_writes(cache: Cache | None, shared: WriteBuffer | None
                 ) -> Iterator[WriteBuffer | None]:
    """The write buffer a batch uses: ``shared`` (its owner flushes it at the end; the batch
    only keeps the ``FLUSH_SECONDS`` promise) or a fresh one flushed when the batch ends,
    also when it raises. ``None`` without a cache."""
    if cache is None:
        yield None
        return
    writes = shared if shared is not None else WriteBuffer(cache)
    try:
        yield writes
    finally:  # finished work is kept even when an item raises
        if shared is None:
            writes.flush()
        else:
            writes.flush_if_due()
