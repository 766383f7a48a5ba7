"""A graph used as a node of another graph (``Graph.as_node``).

The nested node is an ordinary function node whose callable runs the inner plan through
the shared executor (``execute_batch``): one item, or one item per element of the
``map_over`` lists. Every executor and engine therefore runs nested graphs unchanged —
columnar or per item, in a Dask task or a Daft UDF — and the node caches as one unit,
keyed by the inner graph's code and structure.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from hypernodes_dist.cache.hashing import combine
from hypernodes_dist.errors import GraphBuildError, NestedPause
from hypernodes_dist.events import expanded
from hypernodes_dist.execution.batch import run_batch
from hypernodes_dist.execution.context import PARENT
from hypernodes_dist.execution.job import BatchResult, BatchSettings, Chunk
from hypernodes_dist.execution.syncio import run_sync
from hypernodes_dist.inputs import expand
from hypernodes_dist.missing import MISSING
from hypernodes_dist.nodes import FunctionNode
from hypernodes_dist.plan import Plan, PlannedGraph, compile_plan

__all__ = ["GraphNode", "graph_node", "OMITTED"]


class _Omitted:
    """Default of an optional inner input: the inner nodes use their own defaults."""

    __slots__ = ()
    hn_inherit_default = True  # takes no side in a graph's check of conflicting defaults

    def __repr__(self) -> str:
        return "OMITTED"

    def __reduce__(self) -> str:
        return "OMITTED"

    def __hypernodes_hash__(self) -> str:
        return "omitted"


OMITTED: Any = _Omitted()
_CALLS = itertools.count()  # a nested graph in a loop gets new inner run ids each pass


class GraphNode(FunctionNode):
    """A node running an inner graph; outputs become lists when it maps."""

    nests = True

    def __init__(self, call: _NestedCall, **kwargs: Any) -> None:
        super().__init__(func=call, **kwargs)
        self.inner = call.plan
        self.inner_interrupts = call.plan.interrupts
        self.map_over = call.map_over
        self.is_async = call.plan.is_async


class _NestedCall:
    """The callable of a ``GraphNode``: outer kwargs in, outer outputs out."""

    def __init__(self, plan: Plan, name: str, rename_in: dict[str, str],
                 outputs: dict[str, str], map_over: tuple[str, ...], map_mode: str) -> None:
        self.plan = plan
        self.name = name
        self.rename_in = rename_in  # outer -> inner
        self.outputs = outputs  # outer -> inner
        self.map_over = map_over  # inner names
        self.map_mode = map_mode
        self.__name__ = name
        self.__qualname__ = name

    def inner_inputs(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return {self.rename_in.get(k, k): v for k, v in kwargs.items() if v is not OMITTED}

    def batch(self, kwargs: Mapping[str, Any]) -> tuple[Chunk, BatchSettings]:
        inputs = self.inner_inputs(kwargs)
        if self.map_over:
            columns, broadcast, n = expand(self.plan, inputs, self.map_over, self.map_mode)
        else:
            columns, broadcast, n = {}, inputs, 1
        settings = BatchSettings(session_id="nested", run_prefix=f"{self.name}-",
                                 select=tuple(self.outputs.values()), on_error="raise")
        return Chunk(0, n, columns, broadcast), settings

    def result(self, batch: BatchResult) -> Any:
        values: list[Any] = []
        for inner in self.outputs.values():
            column = batch.outputs[inner]
            if self.map_over:
                values.append([None if v is MISSING else v for v in column])
            else:
                values.append(column[0] if column[0] is not MISSING else None)
        return values[0] if len(values) == 1 else tuple(values)

    def __call__(self, **kwargs: Any) -> Any:
        """Sync inner graphs return the value; async ones return an awaitable."""
        if self.plan.is_async:
            return self.acall(**kwargs)
        return run_sync(self.acall(**kwargs), needs_loop=False)

    async def acall(self, **kwargs: Any) -> Any:
        chunk, settings = self.batch(kwargs)
        if chunk.n == 0:
            empty: list[Any] = [[] for _ in self.outputs]
            return empty[0] if len(empty) == 1 else tuple(empty)
        parent = PARENT.get()
        if parent is not None:  # inner runs are children of the calling run
            settings.want_events = parent.emit is not None
            settings.session_id = parent.session_id
            settings.cache = parent.cache  # identical inner items compute once, as in map
            # inner run ids read {parent run}/{node}-{call}.{element}: unique per call
            settings.run_prefix = f"{parent.run_id}/{self.name}-{next(_CALLS)}."
            if self.plan.interrupts:  # answers given to the calling run are used up here
                given = parent.responses or {}
                settings.responses = {i.name: given.pop(i.name) for i in self.plan.interrupts
                                      if i.name in given}
                settings.handlers = parent.handlers
        emit = parent.emit if parent is not None else None
        if emit is not None:  # a failing inner run reports its events (the failing node's) too
            settings.on_error = "collect"
        batch = await run_batch(self.plan, chunk, settings)
        if parent is not None and emit is not None:
            for event in expanded(batch.events):
                if event.parent_run_id is None:
                    event.parent_run_id = parent.run_id
                emit(event)
        if batch.errors:  # the first failed element's own exception fails the nested node
            raise batch.errors[min(batch.errors)]
        if batch.paused:  # an interrupt with no answer: the calling run pauses too
            name, value = batch.paused[min(batch.paused)]
            raise NestedPause(name, value, self.plan.interrupt(name).response_param)
        return self.result(batch)

    def identity(self) -> str:
        """Code identity: the inner nodes' code, the inner structure and the wiring."""
        ids = self.plan.code_ids(every=True)
        wiring = repr((sorted(self.rename_in.items()), sorted(self.outputs.items()),
                       self.map_over, self.map_mode))
        return combine(self.plan.graph_hash, *(f"{k}={v}" for k, v in sorted(ids.items())), wiring)


def needed_for(plan: Plan, outputs: Sequence[str]) -> Plan:
    """``plan`` cut down to the producers of ``outputs`` and what they need (their
    ancestors, data and activation edges alike): the other nodes would only compute
    results nobody reads. Plans with cycles, and cuts that would drop a branch or gate
    target, stay whole."""
    if plan.topology.has_cycles:
        return plan
    keep = 0
    for output in outputs:
        for producer in plan.producers[output]:
            i = plan.position[producer]
            keep |= plan.ancestors[i] | 1 << i
    kept = [n for i, n in enumerate(plan.nodes) if keep >> i & 1]
    names = {n.name for n in kept}
    if len(kept) == len(plan.nodes) or any(t not in names for n in kept for t in n.targets):
        return plan
    return compile_plan(kept, plan.max_iterations, tuple(plan.resources))


def graph_node(
    graph: PlannedGraph,
    name: str | None = None,
    map_over: str | Sequence[str] | None = None,
    map_mode: str = "zip",
    inputs: Mapping[str, str] | None = None,
    outputs: Mapping[str, str] | None = None,
) -> GraphNode:
    """Build the ``GraphNode`` of ``graph.as_node(...)``; see ``Graph.as_node``."""
    plan = graph.plan
    node_name = name or graph.name
    if plan.interrupts and map_over:
        names = ", ".join(repr(i.name) for i in plan.interrupts)
        raise TypeError(
            f"graph {node_name!r} has an InterruptNode ({names}) and cannot be nested with "
            "map_over: every element would pause on its own, and one response parameter "
            "cannot answer them; nest it without map_over (the outer run pauses and resumes "
            "with the response), or answer with handlers in an explicit loop")
    rename_in = dict(inputs or {})
    unknown_in = [inner for inner in rename_in.values() if inner not in plan.inputs]
    if unknown_in:
        raise GraphBuildError(
            f"nested graph {node_name!r}: inputs renames {unknown_in}, which are not inputs of "
            f"the inner graph ({', '.join(plan.inputs)})", [node_name])
    out_map = dict(outputs) if outputs else {o: o for o in plan.outputs}
    unknown_out = [inner for inner in out_map.values() if inner not in plan.outputs]
    if unknown_out:
        raise GraphBuildError(
            f"nested graph {node_name!r}: outputs renames {unknown_out}, which the inner graph "
            f"does not produce ({', '.join(plan.outputs)})", [node_name])
    mapped = (map_over,) if isinstance(map_over, str) else tuple(map_over or ())
    missing = [m for m in mapped if m not in plan.inputs]
    if missing:
        raise GraphBuildError(
            f"nested graph {node_name!r}: map_over names {missing}, which are not inputs of the "
            f"inner graph ({', '.join(plan.inputs)})", [node_name])
    if outputs:  # only what the exposed outputs need runs (and is an input)
        plan = needed_for(plan, tuple(out_map.values()))
        rename_in = {o: i for o, i in rename_in.items() if i in plan.inputs}
        if any(m not in plan.inputs for m in mapped):
            plan = graph.plan  # a mapped input nothing needed reads: keep the whole graph
            rename_in = dict(inputs or {})
    outer_of = {inner: outer for outer, inner in rename_in.items()}
    params = tuple(outer_of.get(p, p) for p in plan.inputs)
    defaults = {outer_of.get(p, p): OMITTED for p in plan.inputs if p not in plan.required}
    call = _NestedCall(plan, node_name, rename_in, out_map, mapped, map_mode)
    built = GraphNode(
        call,
        name=node_name,
        params=params,
        defaults=defaults,
        outputs=tuple(out_map),
        version=call.identity(),
        cache=not plan.interrupts,  # its result depends on a response, not only its inputs
    )
    built.unkeyed = frozenset(outer_of.get(p, p) for p in plan.unkeyed)  # as inside
    return built
