"""Projections of a trace that only read it: ``summary`` per graph node and ``dag`` layout."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from .log import Trace
from .records import Edge, TraceNode

__all__ = ["NodeStats", "summary", "format_summary", "LaidOutNode", "DagLayout", "dag"]


@dataclass(frozen=True)
class NodeStats:
    """What one graph node did across every run of a trace (durations of real runs, ms)."""

    node: str
    executions: int  # finished executions: ran + cache hits + errors
    ran: int
    cached: int
    errors: int
    retries: int
    skipped: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    total_ms: float


_SLOT = {"complete": 0, "error": 2, "skipped": 4}


def summary(trace: Trace) -> dict[str, NodeStats]:
    """Per graph node: executions, cache hits, errors, retries, p50/p95/max duration."""
    records, batches = trace.columns()
    acc: dict[str, list[Any]] = defaultdict(lambda: [0, 0, 0, 0, 0, []])
    for r in records:  # acc[node]: ran, cached, errors, retries, skipped, durations
        if r.kind == "node":
            a = acc[r.node_id]
            a[3] += max(0, r.attempts - 1)
            if r.status == "complete" and not r.cached and r.duration_ms is not None:
                a[5].append(r.duration_ms)
            if r.status in _SLOT:  # complete (ran or cached), error or skipped
                a[_SLOT[r.status] + (r.status == "complete" and r.cached)] += 1
    for event in batches:  # map batches read as columns: complete, one attempt each
        for part in event.parts:
            a = acc[part.node_id]
            a[1 if part.cached else 0] += len(part.items)
            a[5].extend([] if part.cached else event.durations(part))
    out = {}
    for name, (ran, cached, errors, retries, skipped, durations) in acc.items():
        durations.sort()
        pick = [float(durations[max(1, math.ceil(q * len(durations))) - 1]) if durations
                else 0.0 for q in (0.5, 0.95)]  # nearest rank
        out[name] = NodeStats(name, ran + cached + errors, ran, cached, errors, retries, skipped,
                              *pick, float(max(durations, default=0.0)), float(sum(durations)))
    return out


def format_summary(stats: dict[str, NodeStats]) -> str:
    """A plain-text table of ``summary(trace)``."""
    head = ("node", "execs", "ran", "cached", "errors", "retries", "p50 ms", "p95 ms", "max ms")
    rows = [head] + [(s.node, str(s.executions), str(s.ran), str(s.cached), str(s.errors),
                      str(s.retries), f"{s.p50_ms:.3f}", f"{s.p95_ms:.3f}", f"{s.max_ms:.3f}")
                     for s in stats.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))) for r in rows)


@dataclass(frozen=True)
class LaidOutNode:
    id: str
    kind: str
    label: str
    status: str
    x: int  # depth: longest path from a root
    y: int  # rank within its depth, creation order


@dataclass(frozen=True)
class DagLayout:
    nodes: tuple[LaidOutNode, ...]
    edges: tuple[Edge, ...]
    width: int  # number of depths
    height: int  # the most nodes at one depth


def _label(n: TraceNode) -> str:
    if n.kind == "map":
        return f"map ({n.items} items, {n.failed} failed)"
    if n.kind == "run":
        return f"item {n.item_index}" if n.item_index is not None else f"run {n.run_id}"
    return n.node_id if n.iteration == 0 else f"{n.node_id} #{n.iteration}"


def dag(trace: Trace) -> DagLayout:
    """The trace graph laid out in layers: x = depth, y = rank within the layer."""
    edges, depth, rank, laid = trace.edges, {}, {}, []
    for src, dst, _kind in edges:  # a vertex's edges arrive after its source exists
        depth[dst] = max(depth.get(dst, 0), depth.get(src, 0) + 1)
    for n in trace.nodes.values():
        x = depth.get(n.id, 0)
        rank[x] = rank.get(x, 0) + 1
        laid.append(LaidOutNode(n.id, n.kind, _label(n), n.status, x, rank[x] - 1))
    return DagLayout(tuple(laid), edges, max(rank) + 1 if rank else 0, max(rank.values(), default=0))
