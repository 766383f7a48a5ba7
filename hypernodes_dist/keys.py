"""Cache keys of node executions, shared by every executor and every engine's workers.

Keys *chain*: the identity of a value a cacheable node produced is derived from that
node's key (``combine(key, output)``), not from the value. A warm run can therefore compute
every key of an item from its inputs alone and fetch only the outputs it returns. Values
from graph inputs, defaults and non-cacheable nodes are identified by their content hash.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .nodes import HyperNode
from .plan import Plan

__all__ = ["Keys", "scope_token"]


def scope_token(scope: str, session_id: str, run_id: str) -> str | None:
    """The id a cache scope mixes into every key (none for ``global``)."""
    if scope == "session":
        return session_id
    if scope == "run":
        return run_id
    return None


class Keys:
    """Key arithmetic for one plan and one cache."""

    def __init__(self, plan: Plan, cache: Any) -> None:
        from . import hashing

        self._hashing = hashing
        self.cache = cache
        self.scope = getattr(cache, "scope", "global")
        self.code_ids = plan.code_ids()
        self._out_ids: dict[str, str] = {}
        self._default_ids: dict[tuple[str, str], str] = {}

    def cacheable(self, node: HyperNode) -> bool:
        return node.name in self.code_ids

    def value_id(self, value: Any) -> str:
        return self._hashing.hash_value(value)

    def default_id(self, node: HyperNode, param: str) -> str:
        memo = (node.name, param)
        found = self._default_ids.get(memo)
        if found is None:
            found = self._default_ids[memo] = self._hashing.hash_value(node.defaults[param])
        return found

    def key(self, node: HyperNode, arg_ids: Sequence[str], token: str | None) -> str:
        return self._hashing.node_key(self.code_ids[node.name], list(zip(node.params, arg_ids)), token)

    def output_id(self, key: str, output: str) -> str:
        out = self._out_ids.get(output)
        if out is None:
            out = self._out_ids[output] = self._hashing.hash_value(output)
        return self._hashing.combine(key, out)
