"""Binding resources into nodes, once, when a plan is compiled.

A node that takes resources becomes a copy whose function fetches them from the
per-process registry at each call (a dictionary look-up once built) and calls the
original with them. Its parameters lose the resource names (they are not graph inputs,
never hashed, never in events) and gain the inputs its resources read (broadcast values
such as a base URL, which then count in its cache key, unless every resource reading one
names it in ``not_in_key`` and the node does not read it: ``unkeyed``); its code identity
adds each resource's (``salt``). Every executor and engine calls the bound node as any other.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from asyncio.events import _get_running_loop
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from hypernodes_dist.batchapi.recording import (
    BatchWait,
    BudgetRefusal,
    UnbatchableCall,
    answered_scope,
    in_batch_api,
    restore_answered,
    unanswered,
)
from hypernodes_dist.cache.codeid import hash_code
from hypernodes_dist.cache.hashing import UnhashableValueError, combine, hash_value
from hypernodes_dist.errors import GraphBuildError
from hypernodes_dist.execution.batchwait import LINK, outcome, swap_clients
from hypernodes_dist.nodes import HyperNode
from hypernodes_dist.policies.learned import watch
from hypernodes_dist.policies.spec import Policy
from hypernodes_dist.policies.usage import CALL, NODE, count_batch_call
from hypernodes_dist.resources import registry
from hypernodes_dist.resources.declare import Resource

__all__ = ["split_resources", "bind_resources", "resource_identities", "node_clients"]

_SIGNALS = (BatchWait, UnbatchableCall, BudgetRefusal)


def split_resources(items: Iterable[Any]) -> tuple[list[HyperNode], dict[str, Resource]]:
    """A graph's node list as its nodes and its resources (by name)."""
    nodes: list[HyperNode] = []
    resources: dict[str, Resource] = {}
    for item in items:
        if isinstance(item, Resource):
            if item.name in resources:
                raise GraphBuildError(f"two resources are named {item.name!r}")
            resources[item.name] = item
        else:
            nodes.append(item)
    return nodes, resources


def resource_identities(resources: Mapping[str, Resource]) -> dict[str, str]:
    """Each resource's code identity (its function or ``version=``, and those of the
    resources it takes); rejects resources that take each other in a cycle."""
    found: dict[str, str] = {}

    def identity(name: str, path: tuple[str, ...]) -> str:
        if name in path:
            raise GraphBuildError(f"resources take each other in a cycle: {' -> '.join(path + (name,))}")
        if name not in found:
            res = resources[name]
            takes = [identity(p, path + (name,)) for p in res.params if p in resources]
            found[name] = combine("hn-resource", hash_code(res.func, res.version), *takes)
        return found[name]

    for name in resources:
        identity(name, ())
    return found


def bind_resources(nodes: Sequence[HyperNode], resources: Mapping[str, Resource]) -> list[HyperNode]:
    """``nodes`` with every node that takes a resource bound to it (see the module doc)."""
    bad = [n.name for n in nodes if n.batch_api and not any(p in resources for p in n.params)]
    if bad:
        raise GraphBuildError(
            f"node(s) {', '.join(map(repr, bad))}: batch_api=True batches the calls of the "
            "openai/anthropic clients a node receives from a @resource; give the node its "
            "client as a resource parameter (or set batch_api=False)")
    if not resources:
        return list(nodes)
    produced = {o: n.name for n in nodes for o in n.outputs}
    clash = sorted(r for r in resources if r in produced)
    if clash:
        raise GraphBuildError("; ".join(
            f"resource {r!r} has the name of an output of node {produced[r]!r}" for r in clash))
    idents = resource_identities(resources)
    return [_bound(n, resources, idents) if any(p in resources for p in n.params) else n
            for n in nodes]


def node_clients(node: HyperNode, values: Mapping[str, Any]) -> dict[str, Any]:
    """The resources ``node`` receives, built in this process from ``values`` (the inputs
    they read): the driver's copies of a ``batch_api`` node's clients."""
    fetch: _Fetch | None = getattr(node, "fetch_resources", None)
    if fetch is None:
        return {}
    built = fetch.get(values)
    return {p: built[p] for p in node.resources}


def _needed(names: Iterable[str], resources: Mapping[str, Resource]) -> list[Resource]:
    """The resources ``names`` take, with those they take, dependencies first."""
    out: dict[str, Resource] = {}

    def visit(name: str) -> None:
        res = resources[name]
        for p in res.params:
            if p in resources:
                visit(p)
        out.setdefault(name, res)

    for name in names:
        if name in resources:
            visit(name)
    return list(out.values())


def _bound(node: HyperNode, resources: Mapping[str, Resource], idents: Mapping[str, str]) -> HyperNode:
    direct = [p for p in node.params if p in resources]
    needed = _needed(direct, resources)
    hidden = {p: r.defaults.get(p) for r in needed for p in r.params
              if p not in resources and p not in node.params}
    has_default = {p for r in needed for p in r.params if p in r.defaults}
    bound = copy.copy(node)
    bound.params = tuple(p for p in node.params if p not in resources) + tuple(hidden)
    bound.defaults = {**node.defaults, **{p: v for p, v in hidden.items() if p in has_default}}
    bound.salt = node.salt + tuple(f"{p}={idents[p]}" for p in direct)
    bound.code = node.code
    bound.resources = tuple(direct)
    bound.unkeyed = node.unkeyed | {p for p in hidden if all(
        p in r.not_in_key for r in needed if p in r.params)}
    # a sync node taking an async resource awaits it: the bound node is async
    bound.is_async = node.is_async or any(r.is_async for r in needed)
    bound.policy = _with_limits(node, [resources[p] for p in direct], idents)
    bound.fetch_resources = fetch = _Fetch(needed, idents)  # type: ignore[attr-defined]  # only a bound node carries its resource fetch
    if bound.policy is not None and bound.policy.shared:
        bound.limits_for = ApiLimits(bound.policy, fetch)  # type: ignore[attr-defined]  # only a bound node keys its limits by API
    bound.func = _caller(node, bound.is_async, direct, fetch, tuple(hidden))
    return bound


def limits_key(res: Resource, ident: str) -> str:
    """The key of a resource's limits in the limits backend: its name and identity (the
    API it is built for is added per map: ``api_key``)."""
    return f"resource:{res.name}:{ident[:16]}"


def api_key(key: str, digest: str | None) -> str:
    """A resource's limits key for the API it is built for (``digest``: of what it is built
    from, ``_Fetch.api_digests``; none: the resource's own key)."""
    return f"{key}@{digest[:16]}" if digest else key


class ApiLimits:
    """A bound node's policy with each resource's limits keyed by the API it is built for:
    a provider limits an API key at an endpoint, not a function, so one resource function
    built with two keys or endpoints keeps two of each limit, hold-off, back-off and
    learned limit. ``self(values)``: the policy for calls with those inputs (made once per
    set of APIs)."""

    def __init__(self, policy: Policy, fetch: _Fetch) -> None:
        self.policy, self.fetch = policy, fetch
        names = {limits_key(r, ident): r.name for r, ident in fetch.needed}
        self.names = [names[s.node] for s in policy.shared]  # each shared limit's resource
        self.made: dict[tuple[str | None, ...], Policy] = {}

    def __call__(self, values: Mapping[str, Any]) -> Policy:
        digests = self.fetch.api_digests(values)
        apis = tuple(digests[name] for name in self.names)
        found = self.made.get(apis)
        if found is None:
            if len(self.made) >= _MOST_APIS:
                self.made.clear()
            shared = tuple(dataclasses.replace(s, node=api_key(s.node, d))
                           for s, d in zip(self.policy.shared, apis))
            found = self.made[apis] = dataclasses.replace(self.policy, shared=shared)
        return found

    def __getstate__(self) -> dict[str, Any]:  # shipped without this process's policies
        return {**self.__dict__, "made": {}}


_MOST_APIS = 64  # policies kept per node (one per set of APIs its calls were built for)


def _digest(parts: list[Any]) -> str | None:
    """The digest of a resource's inputs (``""``: it has none; ``None``: one has no canonical
    hash, so its calls keep the resource's own key; building it says what is wrong)."""
    if not parts:
        return ""
    try:
        return hash_value(tuple(parts))
    except UnhashableValueError:
        return None


def _with_limits(node: HyperNode, received: list[Resource], idents: Mapping[str, str]
                 ) -> Policy | None:
    """The node's policy with the limits of the resources it receives (``Policy.shared``,
    in key order, so every node takes shared units in one order: no deadlock); a resource
    declaring none gets an empty one (it learns its provider's, ``policies/learned.py``)."""
    if not received:
        return node.policy
    shared = tuple(sorted((dataclasses.replace(r.limits or Policy(""),
                                               node=limits_key(r, idents[r.name]))
                           for r in received), key=lambda p: p.node))
    return dataclasses.replace(node.policy or Policy(node.name), shared=shared)


def _caller(node: HyperNode, is_async: bool, direct: list[str], fetch: _Fetch,
            hidden: tuple[str, ...]) -> Callable[..., Any]:
    """The bound node's function: fetch the resources, call the original with them (an
    async caller awaits async resources; a sync function is then called from it). In a
    ``batch_api`` node the clients are recording copies (``execution/batchwait.py``)."""
    func = node.func
    assert func is not None
    fetch.hidden = hidden
    pick = _Pick(direct, node.batch_api)
    if is_async and node.is_generator:
        async def call(**kwargs: Any) -> Any:
            built = await fetch.ataking(kwargs)
            chunks = func(**kwargs, **pick(built))
            if hasattr(chunks, "__aiter__"):
                async for chunk in chunks:
                    yield chunk
            else:
                for chunk in chunks:
                    yield chunk
    elif is_async and node.batch_api:
        call = _batch_call(func, node, fetch, pick)
    elif is_async:
        async def call(**kwargs: Any) -> Any:  # type: ignore[misc]  # the async variant of call
            built = await fetch.ataking(kwargs)
            value = func(**kwargs, **pick(built))
            return await value if node.is_async else value
    elif node.is_generator:
        def call(**kwargs: Any) -> Any:
            built = fetch.taking(kwargs)
            yield from func(**kwargs, **pick(built))
    else:
        def call(**kwargs: Any) -> Any:
            built = fetch.taking(kwargs)
            return func(**kwargs, **pick(built))
    if node.batch_api and not is_async:
        call = _signalled(call, node.name)
    functools.update_wrapper(call, func)
    del call.__wrapped__  # type: ignore[attr-defined]  # the bound signature is **kwargs
    return call


def _batch_call(func: Callable[..., Any], node: HyperNode, fetch: _Fetch, pick: _Pick
                ) -> Callable[..., Any]:
    """An async ``batch_api`` node's call: the resources, then the code as ``_signalled``
    runs it, in one coroutine (its calls are many: one frame and one copy of the
    arguments fewer per call)."""
    name, awaited = node.name, node.is_async

    async def call(**kwargs: Any) -> Any:
        built = await fetch.ataking(kwargs)
        token = unanswered()  # ``answered_scope``, its object inlined
        try:
            try:
                value = func(**kwargs, **pick(built))
                if awaited:
                    value = await value
            except _SIGNALS as exc:
                err = _detached(exc, name)
            else:
                _count_answered()
                return value
        finally:
            restore_answered(token)
        raise err
    return call


class _Pick:
    """The clients a call receives of what its fetch built (a ``batch_api`` node's: their
    recording copies while a map's batch link is current); the last call's again for the
    same built objects and link."""

    __slots__ = ("names", "batch_api", "last")

    def __init__(self, names: list[str], batch_api: bool) -> None:
        self.names, self.batch_api = names, batch_api
        self.last: tuple[Any, Any, dict[str, Any]] | None = None  # built, link, picked

    def __reduce__(self) -> tuple[Any, ...]:  # shipped without what this process picked
        return (_Pick, (self.names, self.batch_api))

    def __call__(self, built: Mapping[str, Any]) -> dict[str, Any]:
        link = LINK.get() if self.batch_api else None
        last = self.last
        if last is not None and last[0] is built and last[1] is link:
            return last[2]
        picked = swap_clients(built, self.names) if self.batch_api else _direct(built,
                                                                                 self.names)
        self.last = (built, link, picked)
        return picked


def _direct(built: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    return {p: built[p] for p in names}


def _signalled(call: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A sync ``batch_api`` node's call: ``in_batch_api()`` False until a batch answers one
    of its calls; a recorded call makes the item wait (``WaitingForBatch``), an unbatchable
    call or a budget refusal fails it (``batchwait.outcome``). The async twin is
    ``_batch_call`` (a ``batch_api`` node streams nothing: no generator)."""
    def signalled_sync(**kwargs: Any) -> Any:
        with answered_scope():
            try:
                value = call(**kwargs)
            except _SIGNALS as exc:
                err = _detached(exc, name)
            else:
                _count_answered()
                return value
        raise err
    return signalled_sync


def _detached(signal: BaseException, name: str) -> BaseException:
    """``outcome(signal, name)`` raised outside the ``except``: no ``__context__`` and the
    signal's traceback dropped, so nothing keeps the client's call stack (its frames and
    their locals) alive once the row waits; otherwise every recorded row leaves a cycle
    for the collector (the collector's full passes were ~15% of a batch map's CPU)."""
    signal.__traceback__ = None
    err = outcome(signal, name)
    err.__suppress_context__ = True
    return err


def _count_answered() -> None:
    """A call answered by a batch counts apart in the node's usage (``batch_calls``), and
    the ``cost`` it metered (at the batch rate: what it saved) as ``batch_cost``."""
    if not in_batch_api():
        return
    used = CALL.get()
    if used is not None or NODE.get() is not None:
        count_batch_call(used.get("cost") if used is not None else None)


class _Fetch:
    """Fetches a node's resources (dependencies first) from this process's registry."""

    def __init__(self, needed: list[Resource], idents: Mapping[str, str]) -> None:
        self.needed = [(r, idents[r.name]) for r in needed]
        # where a built object's responses teach limits (a resource declaring none)
        self.learns = {r.name: limits_key(r, idents[r.name]) for r in needed if r.limits is None}
        # the last inputs (every value, as given), their digest and their dict, by resource
        self.digests: dict[str, tuple[tuple[Any, ...], str, dict[str, Any]]] = {}
        names = {r.name for r in needed}
        # the values the resources read, and the last fetch: (those values, the registry,
        # its generation, the running loop, what it built): a map's every call reads the
        # same broadcast values, so its calls after the first reuse the first's objects
        self.reads = tuple(dict.fromkeys(p for r in needed for p in r.params if p not in names))
        self.last: tuple[tuple[Any, ...], Any, int, Any, dict[str, Any]] | None = None
        self.on_loop = any(r.is_async for r in needed)  # built per event loop
        self.hidden: tuple[str, ...] = ()  # inputs only resources read (not the node)
        # the last api_digests: (the values it read, as given; its digests)
        self.apis: tuple[tuple[Any, ...], dict[str, str | None]] | None = None

    def api_digests(self, values: Mapping[str, Any]) -> dict[str, str | None]:
        """Each resource's API for ``values``: the digest of what it is built from (its
        inputs, and the APIs of the resources it takes); ``None`` where an input is not in
        ``values`` (a per-item input, seen by a batch's policy: the resource's own key)."""
        given = tuple(values.get(p, _ABSENT) for p in self.reads)
        last = self.apis
        if last is not None and all(a is b for a, b in zip(last[0], given)):
            return last[1]
        found: dict[str, str | None] = {}
        for res, _ in self.needed:  # dependencies first
            parts = [found[p] if p in found else values.get(p, _ABSENT) for p in res.params]
            unknown = any(v is _ABSENT or (v is None and p in found)
                          for p, v in zip(res.params, parts))
            found[res.name] = None if unknown else _digest(parts)
        self.apis = (given, found)
        return found

    def _learn(self, res: Resource, obj: Any, values: Mapping[str, Any]) -> None:
        """``obj``'s responses teach the limits of ``res`` (one declaring none), under the
        resource's own key and its API's (a batch's policy reads the one it can name)."""
        key = self.learns[res.name]
        watch(obj, key)
        digest = self.api_digests(values)[res.name]
        if digest:
            watch(obj, api_key(key, digest))

    def _inputs(self, res: Resource, values: Mapping[str, Any],
                built: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        """The resource's inputs and the digest of those not built; the last call's (the
        same dict) when every input is the same object again (a map's broadcast values)."""
        given = [built[p] if p in built else values.get(p, res.defaults.get(p))
                 for p in res.params]
        last = self.digests.get(res.name)
        if last is not None and len(last[0]) == len(given) and all(
                a is b for a, b in zip(last[0], given)):
            return last[2], last[1]
        inputs = dict(zip(res.params, given))
        plain = tuple(v for p, v in inputs.items() if p not in built)
        digest = hash_value(plain) if plain else ""
        self.digests[res.name] = (tuple(given), digest, inputs)
        return inputs, digest

    def get(self, values: Mapping[str, Any]) -> dict[str, Any]:
        built: dict[str, Any] = {}
        reg = registry.REGISTRY
        generation = reg.generation
        for res, ident in self.needed:
            inputs, digest = self._inputs(res, values, built)
            built[res.name] = obj = reg.get(res, ident, digest, inputs)
            if res.name in self.learns:
                self._learn(res, obj, values)
        self._remember(values, reg, generation, built)
        return built

    async def aget(self, values: Mapping[str, Any]) -> dict[str, Any]:
        built: dict[str, Any] = {}
        reg = registry.REGISTRY
        generation = reg.generation
        for res, ident in self.needed:
            inputs, digest = self._inputs(res, values, built)
            built[res.name] = obj = await reg.aget(res, ident, digest, inputs)
            if res.name in self.learns:
                self._learn(res, obj, values)
        self._remember(values, reg, generation, built)
        return built

    def _remember(self, values: Mapping[str, Any], reg: registry.Registry, generation: int,
                  built: dict[str, Any]) -> None:
        self.last = (tuple(values.get(p, _ABSENT) for p in self.reads), reg, generation,
                     _get_running_loop() if self.on_loop else None, built)

    def __getstate__(self) -> dict[str, Any]:  # shipped without this process's objects
        return {**self.__dict__, "last": None, "apis": None}

    def taking(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The resources of a call with ``kwargs`` (the last call's when it read the same
        values); the hidden inputs (what only resources read) leave ``kwargs``."""
        built = self.reused(kwargs)
        if built is None:
            built = self.get(kwargs)
        for p in self.hidden:
            del kwargs[p]
        return built

    async def ataking(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``taking`` for an async caller (async resources are awaited)."""
        built = self.reused(kwargs)
        if built is None:
            built = await self.aget(kwargs)
        for p in self.hidden:
            del kwargs[p]
        return built

    def reused(self, values: Mapping[str, Any]) -> dict[str, Any] | None:
        """The last ``aget``'s resources when ``values`` holds the same objects it read, on
        the same loop, and the registry has not closed them since (else ``None``)."""
        last = self.last
        if last is None:
            return None
        given, reg, generation, loop, built = last
        if reg is not registry.REGISTRY or reg.generation != generation or (
                self.on_loop and loop is not _get_running_loop()):
            return None
        for p, v in zip(self.reads, given):
            if values.get(p, _ABSENT) is not v:
                return None
        return built


_ABSENT = object()  # an input not given (its resource's default applies)
