"""Graph structure: producers, build-time validation and a deterministic execution order.

Edges are data edges (producer -> consumer of one of its outputs) plus activation edges
(branch/gate -> target). The order of the node list never matters: every ordering here
breaks ties by node name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hypernodes_dist.errors import (
    AmbiguousProducerError,
    DuplicateNodeError,
    GraphBuildError,
    InvalidCycleError,
    UnknownTargetError,
)
from hypernodes_dist.nodes import HyperNode

__all__ = ["Topology", "analyze"]


@dataclass(frozen=True)
class Topology:
    """The analysed structure of a node set."""

    order: tuple[str, ...]  # deterministic topological order (back edges of cycles removed)
    producers: dict[str, tuple[str, ...]]  # output name -> nodes writing it
    deciders: dict[str, tuple[str, ...]]  # target node -> branch/gate nodes activating it
    successors: dict[str, tuple[str, ...]]  # all edges, data and activation
    ancestors: dict[str, int]  # bitmask over ``order`` positions, back edges removed
    cycles: tuple[tuple[str, ...], ...]  # strongly connected components with a loop
    inputs: tuple[str, ...]  # parameters no node produces
    required: tuple[str, ...]  # inputs that some consumer needs without a default

    @property
    def has_cycles(self) -> bool:
        return bool(self.cycles)

    def cycle_of(self, name: str) -> tuple[str, ...]:
        for component in self.cycles:
            if name in component:
                return component
        return (name,)


def analyze(nodes: Sequence[HyperNode]) -> Topology:
    """Validate ``nodes`` and compute their topology; raises ``GraphBuildError`` subclasses."""
    by_name = _unique(nodes)
    deciders = _deciders(by_name)
    producers = _producers(by_name)
    successors = _successors(by_name, producers)
    _check_producers(producers, deciders, successors)
    _check_cycles(by_name, successors, deciders)
    order, back_edges = _order(by_name, successors)
    ancestors = _ancestors(order, successors, back_edges)
    components = tuple(c for c in _sccs(sorted(by_name), successors) if _loops(c, successors))
    inputs, required = _inputs(by_name, producers)
    _check_defaults(by_name, inputs)
    return Topology(
        order=order,
        producers=producers,
        deciders=deciders,
        successors=successors,
        ancestors=ancestors,
        cycles=components,
        inputs=inputs,
        required=required,
    )


def _unique(nodes: Sequence[HyperNode]) -> dict[str, HyperNode]:
    by_name: dict[str, HyperNode] = {}
    for n in nodes:
        if not isinstance(n, HyperNode):
            raise TypeError(
                f"Graph nodes must be decorated with @node/@branch/@gate or be InterruptNode, "
                f"got {n!r}"
            )
        if n.name in by_name:
            raise DuplicateNodeError(f"two nodes are named {n.name!r}", [n.name])
        by_name[n.name] = n
    return by_name


def _deciders(by_name: dict[str, HyperNode]) -> dict[str, tuple[str, ...]]:
    deciders: dict[str, list[str]] = {}
    for n in by_name.values():
        for target in n.targets:
            if target not in by_name:
                known = ", ".join(sorted(by_name))
                hint = (
                    "; to end the run, use the END constant (from hypernodes_dist import END; "
                    "Literal[..., END]), not the string 'END'" if target == "END" else ""
                )
                raise UnknownTargetError(
                    f"{n.kind} {n.name!r} targets {target!r}, which is not a node of the graph "
                    f"(nodes: {known}){hint}",
                    [n.name, target],
                )
            if target == n.name:
                raise UnknownTargetError(f"{n.kind} {n.name!r} targets itself", [n.name])
            deciders.setdefault(target, []).append(n.name)
    return {t: tuple(sorted(d)) for t, d in deciders.items()}


def _producers(by_name: dict[str, HyperNode]) -> dict[str, tuple[str, ...]]:
    producers: dict[str, list[str]] = {}
    for n in by_name.values():
        for out in n.outputs:
            producers.setdefault(out, []).append(n.name)
    return {o: tuple(sorted(p)) for o, p in producers.items()}


def _successors(
    by_name: dict[str, HyperNode], producers: dict[str, tuple[str, ...]]
) -> dict[str, tuple[str, ...]]:
    succ: dict[str, set[str]] = {name: set() for name in by_name}
    for n in by_name.values():
        for p in n.params:
            for producer in producers.get(p, ()):
                succ[producer].add(n.name)
        for target in n.targets:
            succ[n.name].add(target)
    return {name: tuple(sorted(s)) for name, s in succ.items()}


def _check_producers(
    producers: dict[str, tuple[str, ...]],
    deciders: dict[str, tuple[str, ...]],
    successors: dict[str, tuple[str, ...]],
) -> None:
    cyclic = {n for c in _sccs(sorted(successors), successors) if _loops(c, successors) for n in c}
    for output, writers in producers.items():
        for i, a in enumerate(writers):
            for b in writers[i + 1 :]:
                if _exclusive(a, b, deciders) or _cycle_target(a, deciders, cyclic):
                    continue
                if _cycle_target(b, deciders, cyclic):
                    continue
                raise AmbiguousProducerError(
                    f"output {output!r} is produced by both {a!r} and {b!r}; two nodes may write "
                    "one name only as mutually exclusive targets of one branch/gate, or when one "
                    "is a branch/gate target on a cycle",
                    [a, b],
                )


def _exclusive(a: str, b: str, deciders: dict[str, tuple[str, ...]]) -> bool:
    return bool(set(deciders.get(a, ())) & set(deciders.get(b, ())))


def _cycle_target(name: str, deciders: dict[str, tuple[str, ...]], cyclic: set[str]) -> bool:
    return name in deciders and name in cyclic


def _check_cycles(
    by_name: dict[str, HyperNode],
    successors: dict[str, tuple[str, ...]],
    deciders: dict[str, tuple[str, ...]],
) -> None:
    """Every cycle must pass through a branch/gate target: a target runs once per activation,
    so the decision controls the loop. (A cycle through a branch/gate always passes through
    one of its targets.)"""
    free = {n for n in by_name if n not in deciders and not by_name[n].targets}
    sub = {n: tuple(s for s in successors[n] if s in free) for n in free}
    for component in _sccs(sorted(free), sub):
        if _loops(component, sub):
            names = ", ".join(component)
            raise InvalidCycleError(
                f"cycle through {names} has no branch or gate on it; route the loop through "
                "a @branch or @gate so it can end",
                component,
            )


def _loops(component: tuple[str, ...], successors: dict[str, tuple[str, ...]]) -> bool:
    return len(component) > 1 or component[0] in successors.get(component[0], ())


def _sccs(names: list[str], successors: dict[str, tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Strongly connected components (iterative Tarjan), each sorted by name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[tuple[str, ...]] = []
    counter = 0
    for root in names:
        if root in index:
            continue
        work = [(root, iter(successors.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(successors.get(w, ()))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                result.append(tuple(sorted(comp)))
    return result


def _order(
    by_name: dict[str, HyperNode], successors: dict[str, tuple[str, ...]]
) -> tuple[tuple[str, ...], set[tuple[str, str]]]:
    """Topological order of the components; inside a cycle, DFS order from its entry nodes.

    Returns the order and the back edges (removed to make the order a DAG order)."""
    comps = _sccs(sorted(by_name), successors)
    comp_of = {n: i for i, c in enumerate(comps) for n in c}
    preds: dict[str, set[str]] = {n: set() for n in by_name}
    for v, ws in successors.items():
        for w in ws:
            preds[w].add(v)
    # Kahn over the condensation, ties broken by the component's smallest name.
    indegree = {i: 0 for i in range(len(comps))}
    comp_succ: dict[int, set[int]] = {i: set() for i in range(len(comps))}
    for v, ws in successors.items():
        for w in ws:
            a, b = comp_of[v], comp_of[w]
            if a != b and b not in comp_succ[a]:
                comp_succ[a].add(b)
                indegree[b] += 1
    ready = sorted((comps[i][0], i) for i, d in indegree.items() if d == 0)
    order: list[str] = []
    back: set[tuple[str, str]] = set()
    while ready:
        _, i = ready.pop(0)
        members = set(comps[i])
        order.extend(_order_component(comps[i], members, successors, preds, back))
        for j in comp_succ[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append((comps[j][0], j))
                ready.sort()
    return tuple(order), back


def _order_component(
    comp: tuple[str, ...],
    members: set[str],
    successors: dict[str, tuple[str, ...]],
    preds: dict[str, set[str]],
    back: set[tuple[str, str]],
) -> list[str]:
    if len(comp) == 1:
        if comp[0] in successors.get(comp[0], ()):
            back.add((comp[0], comp[0]))
        return list(comp)
    entries = [n for n in comp if preds[n] - members] or [comp[0]]
    visited: set[str] = set()
    on_path: set[str] = set()
    post: list[str] = []

    def visit(v: str) -> None:
        visited.add(v)
        on_path.add(v)
        for w in successors[v]:
            if w not in members:
                continue
            if w in on_path:
                back.add((v, w))
            elif w not in visited:
                visit(w)
        on_path.discard(v)
        post.append(v)

    for e in entries + list(comp):
        if e not in visited:
            visit(e)
    return post[::-1]


def _ancestors(
    order: tuple[str, ...], successors: dict[str, tuple[str, ...]], back: set[tuple[str, str]]
) -> dict[str, int]:
    pos = {n: i for i, n in enumerate(order)}
    anc = {n: 0 for n in order}
    for v in order:  # order is a topological order of the edges that are not back edges
        for w in successors[v]:
            if (v, w) not in back:
                anc[w] |= anc[v] | (1 << pos[v])
    return anc


def _check_defaults(by_name: dict[str, HyperNode], inputs: tuple[str, ...]) -> None:
    """One graph input read by several nodes with different defaults is ambiguous: reject
    it, naming the nodes and their defaults. A default that defers to the readers' own
    (a nested graph's optional input: ``hn_inherit_default``) takes no side."""
    for p in inputs:
        found = [(n.name, n.defaults[p]) for name, n in sorted(by_name.items())
                 if p in n.params and p in n.defaults
                 and not getattr(type(n.defaults[p]), "hn_inherit_default", False)]
        if any(not _same(found[0][1], v) for _, v in found[1:]):
            listed = ", ".join(f"{name}({p}={v!r})" for name, v in found)
            raise GraphBuildError(
                f"graph input {p!r} has different defaults in its readers: {listed}; give them "
                f"one default, or rename the parameter in one of them",
                [name for name, _ in found])


def _same(a: object, b: object) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # values that do not compare (arrays): not provably different
        return True


def _inputs(
    by_name: dict[str, HyperNode], producers: dict[str, tuple[str, ...]]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    inputs: dict[str, bool] = {}
    for name in sorted(by_name):
        n = by_name[name]
        for p in n.params:
            if p in producers:
                continue
            needed = p not in n.defaults
            inputs[p] = inputs.get(p, False) or needed
    ordered = tuple(sorted(inputs))
    return ordered, tuple(p for p in ordered if inputs[p])
