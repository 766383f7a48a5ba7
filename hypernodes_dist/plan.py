"""The executable plan: compiled once per graph, shipped to every engine's workers.

A ``Plan`` holds the nodes in execution order with their argument wiring precomputed, the
control-flow tables of the reactive scheduler, and the cache-key identities of the nodes.
It pickles with cloudpickle, so a Dask task or a Daft UDF runs exactly the executor the
local engine runs (``hypernodes_dist.batch.execute_batch``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hypernodes_dist.cache.codeid import hash_code
from hypernodes_dist.cache.hashing import combine
from hypernodes_dist.nodes import HyperNode, InterruptNode
from hypernodes_dist.topology import Topology, analyze

__all__ = ["Plan", "compile_plan"]


class Plan:
    """Nodes in a deterministic order plus everything an executor needs, precomputed."""

    def __init__(self, nodes: Sequence[HyperNode], topology: Topology, max_iterations: int,
                 resources: Sequence[str] = ()):
        by_name = {n.name: n for n in nodes}
        self.resources = frozenset(resources)  # names bound to ``@resource``s (not inputs)
        self.topology = topology
        self.nodes: tuple[HyperNode, ...] = tuple(by_name[n] for n in topology.order)
        self.position = {n.name: i for i, n in enumerate(self.nodes)}
        self.by_name = by_name
        self.max_iterations = max_iterations
        self.inputs = topology.inputs
        self.required = topology.required
        self.producers = topology.producers
        self.gated = frozenset(topology.deciders)
        self.outputs = _ordered_outputs(self.nodes)
        self.ancestors = tuple(topology.ancestors[n.name] for n in self.nodes)
        self.static = not topology.has_cycles and all(n.kind == "function" for n in self.nodes)
        # columnar: acyclic, no interrupts; branches and gates decided per item. A gate
        # that can END must be comparable with every other node (each one its ancestor or
        # its descendant): then every item meets them in plan order, as the scheduler runs
        # them, and END stops exactly the nodes after the gate (see ``_ends_in_order``)
        self.columnar = not topology.has_cycles and not any(  # nested interrupts pause runs
            n.inner_interrupts for n in self.nodes
        ) and all(
            n.kind in ("function", "branch", "gate") for n in self.nodes
        ) and all(self._ends_in_order(i) for i, n in enumerate(self.nodes) if n.can_end)
        # gates that can END decide once nothing else is ready (scheduler waves)
        self.enders = sum(1 << i for i, n in enumerate(self.nodes) if n.can_end)
        self.is_async = any(n.is_async or (n.streaming and not n.is_generator) for n in self.nodes)
        # flows: items walk the plan one by one (execution/flow.py), so one that waits
        # (async call, retry back-off, limit) holds back no other. Batch nodes do not make
        # a plan flow: their calls already group items, so columnar gathers them
        self.flows = self.columnar and any(n.batch_size is None and (
            n.is_async or (n.streaming and not n.is_generator)
            or (n.policy is not None and n.policy.waits)) for n in self.nodes)
        # interrupts of this graph and of its nested graphs (which pause this graph's runs)
        self.interrupts = tuple(n for n in self.nodes if isinstance(n, InterruptNode)) + tuple(
            i for n in self.nodes for i in n.inner_interrupts)
        self.nested_in = {i.name: n.name for n in self.nodes for i in n.inner_interrupts}
        self.graph_hash = _structure_hash(self.nodes)
        # inputs no cache key reads: every reader leaves them out (``not_in_key``)
        self.unkeyed = frozenset(p for p in self.inputs if all(
            p in n.unkeyed for n in self.nodes if p in n.params))
        self._code_ids: dict[str, str] | None = None

    def _ends_in_order(self, i: int) -> bool:
        """Whether node ``i`` (a gate that can END) is an ancestor or a descendant of every
        other node. Otherwise the scheduler's waves may run an unrelated node before or
        after the gate depending on the item, which only the per-item strategy reproduces."""
        ancestors, bit = self.ancestors, 1 << i
        return all(j == i or ancestors[i] >> j & 1 or ancestors[j] & bit
                   for j in range(len(self.nodes)))

    # -- cache identities (computed in the driver, shipped with the plan) -------------------
    def code_ids(self, every: bool = False) -> dict[str, str]:
        """Code identity of every cacheable node (``every``: of every node with a function);
        computed once in the driver, then pickled with the plan."""
        if self._code_ids is None:
            self._code_ids = {n.name: _code_id(n, n.code) for n in self.nodes
                              if n.func is not None and n.code is not None}
        if every:
            return self._code_ids
        return {k: v for k, v in self._code_ids.items() if self.cacheable(self.by_name[k])}

    def interrupt(self, name: str) -> InterruptNode:
        """The interrupt node called ``name`` (of this graph or of a nested one)."""
        return next(i for i in self.interrupts if i.name == name)

    def cacheable(self, node: HyperNode) -> bool:
        return node.cache and node.kind != "interrupt" and node.func is not None

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def __repr__(self) -> str:
        return f"Plan({[n.name for n in self.nodes]}, static={self.static})"


def compile_plan(nodes: Sequence[HyperNode], max_iterations: int = 1000,
                 resources: Sequence[str] = ()) -> Plan:
    """Validate ``nodes`` and compile them into a ``Plan``; ``resources``: the names of the
    graph's resources (its nodes come already bound to them, ``resources.bind``)."""
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be >= 1, got {max_iterations}")
    return Plan(nodes, analyze(nodes), max_iterations, resources)


def _code_id(node: HyperNode, code: Callable[..., Any]) -> str:
    """A node's code identity: its function (or ``version=``), and its resources'."""
    ident = hash_code(code, node.version)
    return combine(ident, *node.salt) if node.salt else ident


def _ordered_outputs(nodes: Sequence[HyperNode]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for n in nodes:
        seen.update(dict.fromkeys(n.outputs))
    return tuple(seen)


def _structure_hash(nodes: Sequence[HyperNode]) -> str:
    """Hash of the graph's structure (names, kinds, wiring, targets); not of function bodies."""
    h = hashlib.blake2b(digest_size=16)
    for n in sorted(nodes, key=lambda n: n.name):
        h.update(repr((n.name, n.kind, n.params, sorted(n.defaults), n.outputs, n.targets)).encode())
    return h.hexdigest()


class PlannedGraph(Protocol):
    """What views and wrappers of a graph read: its compiled ``plan`` and its ``name``
    (``Graph`` is one; taking this instead of ``Graph`` keeps them below the facade)."""

    plan: Plan
    name: str
