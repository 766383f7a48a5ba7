"""Projections of a trace: ``summary`` per graph node, ``timeline`` (executions on lanes per
worker, drawn to PNG (``viz`` extra) or self-contained HTML) and the ``dag`` layout."""

from __future__ import annotations

import heapq
import html
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate, compress, islice, repeat
from operator import add, gt, itemgetter, le
from pathlib import Path
from typing import Any

from hypernodes_dist.policies.usage import add_usage

from .fold import Edge, TraceNode
from .log import Trace


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
    waited_ms: float = 0.0  # waits of its executions (slots, rate limits, back-offs), total
    usage: dict[str, float] = field(default_factory=dict)  # what its calls metered, summed
    batches: dict[str, int] = field(default_factory=dict)  # its provider batches by state
    batch_lines: int = 0  # lines its provider batches answered


def summary(trace: Trace) -> dict[str, NodeStats]:
    """Per graph node: executions, hits, errors, retries, p50/p95/max running time, waits,
    the usage its calls metered and its provider batches by state."""
    records, batches = trace.columns()
    acc: dict[str, list[Any]] = defaultdict(lambda: [0, 0, 0, 0, 0, [], 0.0])
    usage: dict[str, dict[str, float]] = defaultdict(dict)
    provider: dict[str, tuple[dict[str, int], list[int]]] = defaultdict(lambda: ({}, [0]))
    for r in records:  # acc[node]: ran, cached, errors, retries, skipped, durations, waits
        if r.kind == "batch":
            states, lines = provider[r.node_id]
            states[r.status] = states.get(r.status, 0) + 1
            lines[0] += r.items
        elif r.kind == "node":
            if r.usage:
                add_usage(usage[r.node_id], r.usage)
            a = acc[r.node_id]
            a[3] += max(0, r.attempts - 1)
            a[6] += r.waited_ms
            if r.status == "complete" and not r.cached and r.duration_ms is not None:
                a[5].append(r.duration_ms)
            if r.status in _SLOT:  # complete (ran or cached), error or skipped
                a[_SLOT[r.status] + (r.status == "complete" and r.cached)] += 1
    for event in batches:  # map batches read as columns: complete, one attempt each
        for part in event.columns:
            a = acc[part.node_id]
            a[1 if part.cached else 0] += len(part.items)
            a[5].extend([] if part.cached else event.durations(part))
            for metered in part.usage or ():
                if metered:
                    add_usage(usage[part.node_id], metered)
    out = {}
    for name, (ran, cached, errors, retries, skipped, durations, waited) in acc.items():
        durations.sort()
        p50, p95 = (float(durations[max(1, math.ceil(q * len(durations))) - 1]) if durations
                    else 0.0 for q in (0.5, 0.95))  # nearest rank
        states, lines = provider.get(name, ({}, [0]))
        out[name] = NodeStats(name, ran + cached + errors, ran, cached, errors, retries, skipped,
                              p50, p95, max(durations, default=0.0), sum(durations), waited,
                              usage.get(name, {}), dict(sorted(states.items())), lines[0])
    return out


def format_summary(stats: dict[str, NodeStats]) -> str:
    """A plain-text table of ``summary(trace)``."""
    head = ("node", "execs", "ran", "cached", "errors", "retries", "p50 ms", "p95 ms", "max ms",
            "waited ms", "usage", "batches")
    rows = [head] + [(s.node, *map(str, (s.executions, s.ran, s.cached, s.errors, s.retries)),
                      *(f"{v:.3f}" for v in (s.p50_ms, s.p95_ms, s.max_ms)), f"{s.waited_ms:.1f}",
                      " ".join(f"{q}={v:.4g}" for q, v in s.usage.items()),
                      " ".join(f"{k}={v}" for k, v in s.batches.items()))
                     for s in stats.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))) for r in rows)


@dataclass(frozen=True)
class Span:
    """One node execution on the timeline (seconds since the epoch)."""
    node_id: str
    run_id: str
    item_index: int | None
    iteration: int
    worker: str
    lane: int
    start: float
    end: float
    status: str
    cached: bool


class Timeline:
    """Executions sorted by start, on lanes: one per worker, split where executions
    overlap. Stored as columns; ``spans`` builds the ``Span`` objects on first use."""
    def __init__(self, cols: list[list[Any]], lane: list[int], lanes: tuple[str, ...],
                 workers: tuple[str, ...]) -> None:
        self._cols, self._lane, self.lanes, self.workers = cols, lane, lanes, workers
        self.nodes = tuple(dict.fromkeys(cols[0]))
        self.colors = {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(self.nodes)}
        self.t0: float = cols[6][0] if lane else 0.0
        self.t1: float = max(cols[7]) if lane else 0.0
        self.duration = self.t1 - self.t0
        self._spans: tuple[Span, ...] | None = None

    @property
    def spans(self) -> tuple[Span, ...]:
        if self._spans is None:
            node, run, prefix, item, iteration, worker, start, end, status, cached = self._cols
            runs = [f"{p}{i}" if r is None else r for r, p, i in zip(run, prefix, item)]
            self._spans = tuple(map(Span, node, runs, item, iteration, worker, self._lane,
                                    start, end, status, cached))
        return self._spans

    def __len__(self) -> int:
        return len(self._lane)

    def blocks(self, resolution: float) -> list[tuple[int, str, str, float, float, int]]:
        """Executions merged per (lane, node, class) where closer than ``resolution`` s:
        ``(lane, node, class, start, end, count)`` with class ``ran|cached|error``."""
        node, start, end, status, cached = itemgetter(0, 6, 7, 8, 9)(self._cols)
        classes = ("error" if s == "error" else "cached" if c else "ran"
                   for s, c in zip(status, cached))
        groups: dict[tuple[int, str, str], list[int]] = defaultdict(list)
        for k, key in enumerate(zip(self._lane, node, classes)):
            groups[key].append(k)
        out = []
        for (lane, name, cls), which in groups.items():
            starts, reach = _pick(which, start), list(accumulate(_pick(which, end), max))
            # a block ends before execution j when j starts beyond its reach + resolution
            cuts = list(compress(range(1, len(starts)), map(
                gt, islice(starts, 1, None), map(add, reach, repeat(resolution)))))
            for a, b in zip([0, *cuts], [*cuts, len(starts)]):
                out.append((lane, name, cls, starts[a], reach[b - 1], b - a))
        return out

    def to_png(self, path: str | Path, *, title: str | None = None, width: float = 12.0) -> Path:
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
            from matplotlib.patches import Patch
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("a PNG timeline needs matplotlib: pip install 'hypernodes-dist[viz]'") from exc
        colors, n_lanes, span = self.colors, max(1, len(self.lanes)), max(self.duration, 1e-6)
        fig, ax = plt.subplots(figsize=(width, min(40.0, max(2.8, 0.32 * n_lanes + 1.8))), dpi=100)
        resolution = span / (width * 100)  # about one pixel
        for lane, node, cls, start, end, _count in self.blocks(resolution):
            ax.broken_barh([(start - self.t0, max(end - start, resolution * 1.5))], (lane - 0.4, 0.8),
                           facecolors=_ERROR if cls == "error" else colors[node], edgecolor="none",
                           alpha=_ALPHA[cls], hatch="///" if cls == "cached" else None)
        ax.set_yticks(range(n_lanes), labels=list(self.lanes) or ["-"], fontsize=8)
        ax.set(ylim=(n_lanes - 0.5, -0.5), xlim=(0, span * 1.01),
               xlabel="seconds since the first execution started")
        ax.set_title(self._title(title), fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(handles=[Patch(facecolor=c, alpha=a, label=n, hatch="///" if a < 0.5 else None)
                           for n, c, a in self._legend()],
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        fig.tight_layout()
        (path := Path(path)).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
        plt.close(fig)
        return path

    def to_svg(self, *, width: int = 1200, title: str | None = None) -> str:
        colors, esc = self.colors, html.escape
        label_w, lane_h, top, legend_w = 190, 18, 34, 150
        plot_w, n_lanes = max(200, width - label_w - legend_w - 20), max(1, len(self.lanes))
        span = max(self.duration, 1e-6)
        scale, axis_y = plot_w / span, top + n_lanes * lane_h
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{axis_y + 40}" '
               f'font-family="sans-serif" font-size="11">',
               f'<text x="8" y="18" font-size="13" font-weight="bold">{esc(self._title(title))}</text>']
        for i, lane in enumerate(self.lanes):
            y = top + i * lane_h
            out.append(f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{lane_h}" '
                       f'fill="{"#f6f6f6" if i % 2 == 0 else "#ffffff"}"/>'
                       f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{esc(lane)}</text>')
        for row, node, cls, start, end, count in self.blocks(1.0 / scale):
            tip = f"{node} ({cls}) x{count}: {start - self.t0:.6f}s - {end - self.t0:.6f}s"
            out.append(f'<rect x="{label_w + (start - self.t0) * scale:.2f}" y="{top + row * lane_h + 2}" '
                       f'width="{max((end - start) * scale, 1.0):.2f}" height="{lane_h - 4}" fill="'
                       f'{_ERROR if cls == "error" else colors[node]}" fill-opacity="{_ALPHA[cls]}">'
                       f"<title>{esc(f'{tip} on {self.lanes[row]}')}</title></rect>")
        for k in range(6):
            x = label_w + plot_w * k / 5
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{axis_y}" stroke="#ccc"/>'
                       f'<text x="{x:.1f}" y="{axis_y + 14}" text-anchor="middle">'
                       f"{span * k / 5:.3f}s</text>")
        for i, (name, color, opacity) in enumerate(self._legend()):
            x, y = label_w + plot_w + 16, top + i * 16
            out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{color}" '
                       f'fill-opacity="{opacity}"/><text x="{x + 16}" y="{y + 10}">{esc(name)}</text>')
        return "\n".join([*out, "</svg>"])

    def to_html(self, path: str | Path, *, title: str | None = None,
                stats: dict[str, NodeStats] | None = None) -> Path:
        table = f"<h2>Per node</h2><pre>{html.escape(format_summary(stats))}</pre>" if stats else ""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>'
            f"{html.escape(title or 'hypernodes-dist timeline')}</title><style>body{{font-family:"
            "sans-serif;margin:16px}pre{font-size:12px}svg rect:hover{stroke:#000;"
            f"stroke-width:1}}</style></head><body>{self.to_svg(title=title)}{table}"
            "</body></html>\n", encoding="utf-8")
        return path

    def _legend(self) -> list[tuple[str, str, float]]:  # (name, color, opacity)
        return [(n, c, 0.95) for n, c in self.colors.items()] + [
            ("cache hit", "#999999", 0.4), ("error", _ERROR, 0.95)]

    def _title(self, title: str | None) -> str:
        return (f"{title or 'hypernodes-dist timeline'}: {len(self)} executions, "
                f"{len(self.workers)} worker(s), {self.duration:.3f} s")


def timeline(trace: Trace, *, max_lanes_per_worker: int = 32) -> Timeline:
    """Start/end of every finished execution, with its worker and a drawing lane."""
    cols = _columns(trace)
    by_worker: dict[str, list[int]] = {}
    for k, worker in enumerate(cols[5]):
        by_worker.setdefault(worker, []).append(k)
    lane: list[int] = [0] * len(cols[6])
    lanes: list[str] = []
    for worker in sorted(by_worker):
        used = _assign_lanes(by_worker[worker], cols[6], cols[7], lane, len(lanes),
                             max_lanes_per_worker)
        lanes.extend(worker if used == 1 else f"{worker} #{i}" for i in range(used))
    return Timeline(cols, lane, tuple(lanes), tuple(sorted(by_worker)))


def _columns(trace: Trace) -> list[list[Any]]:
    """Finished executions sorted by start, as columns: node, run (None in a map batch),
    run-id prefix (in a map batch), item, iteration, worker, start, end, status, cached."""
    records, batches = trace.columns()
    rows = [(r.node_id, r.run_id, None, r.item_index, r.iteration, r.worker or "driver",
             r.started_at, r.started_at + (r.duration_ms or 0.0) / 1000.0, r.status,
             bool(r.cached)) for r in records
            if r.kind == "node" and r.started_at is not None and r.status in ("complete", "error")]
    rows += [(f"{r.node_id} batch", r.id, None, None, 0, f"{r.worker or 'provider'} batches",
              r.started_at, r.started_at + r.duration_ms / 1000.0,
              "complete" if r.status in ("done", "cancelled") else "error", False)
             for r in records if r.kind == "batch" and r.started_at is not None
             and r.duration_ms is not None]  # provider batches, on the provider's lane
    cols = [list(col) for col in zip(*rows)] if rows else [[] for _ in range(10)]
    for ev in batches:  # map batches read as columns
        for part in ev.columns:
            n = len(part.items)
            columns: tuple[Iterable[Any], ...] = (
                repeat(part.node_id, n), repeat(None, n), repeat(ev.run_id, n),
                map(add, part.items, repeat(ev.offset)), repeat(0, n),
                repeat(ev.worker or "driver", n), *ev.wall_times(part),
                repeat("complete", n), repeat(part.cached, n))
            for col, values in zip(cols, columns):
                col.extend(values)
    start = cols[6]
    if not all(map(le, start, islice(start, 1, None))):
        order = sorted(range(len(start)), key=start.__getitem__)
        cols = [_pick(order, col) for col in cols]
    return cols


def _assign_lanes(which: list[int], starts: list[float], ends: list[float], lane: list[int],
                  base: int, most: int) -> int:
    """Put executions ``which`` (sorted by start) of one worker on lanes ``base..``: each on
    the lane that freed first, or a new one while fewer than ``most``; returns how many."""
    last = list(accumulate(_pick(which, ends), max))
    if all(map(le, last, map(add, islice(_pick(which, starts), 1, None), repeat(_TOUCH)))):
        for k in which:  # one after the other: one lane
            lane[k] = base
        return 1
    free: list[tuple[float, int]] = []  # (end, sub-lane) of every sub-lane in use
    used = 0
    for k in which:
        start = starts[k]
        if used < most and not (free and free[0][0] <= start + _TOUCH):
            sub, used = used, used + 1
        else:  # the lane that frees first (shared when too many overlap)
            sub = heapq.heappop(free)[1]
        heapq.heappush(free, (max(ends[k], start), sub))
        lane[k] = base + sub
    return used


def _pick(which: list[int], column: list[Any]) -> list[Any]:
    """``[column[k] for k in which]`` at C speed."""
    return list(itemgetter(*which)(column)) if len(which) > 1 else [column[k] for k in which]


_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
            "#ff9da7", "#bab0ac", "#86bcb6", "#8cd17d", "#d4a6c8")
_ALPHA, _ERROR = {"ran": 0.95, "cached": 0.4, "error": 0.95}, "#d62728"
_SLOT = {"complete": 0, "error": 2, "skipped": 4}  # summary: its counter of a status
_TOUCH = 1e-6  # overlaps shorter than this are rounding (floats ~0.24 us apart near 1.8e9)


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
    if n.kind == "batch":
        return f"batch {n.status} ({n.items} lines answered, {n.failed} failed)"
    if n.kind == "run":
        return f"item {n.item_index}" if n.item_index is not None else f"run {n.run_id}"
    return n.node_id if n.iteration == 0 else f"{n.node_id} #{n.iteration}"


def dag(trace: Trace) -> DagLayout:
    """The trace graph laid out in layers: x = depth, y = rank within the layer."""
    edges, laid = trace.edges, []
    depth: dict[str, int] = {}
    rank: dict[int, int] = {}
    for src, dst, _kind in edges:  # a vertex's edges arrive after its source exists
        depth[dst] = max(depth.get(dst, 0), depth.get(src, 0) + 1)
    for n in trace.nodes.values():
        x = depth.get(n.id, 0)
        rank[x] = rank.get(x, 0) + 1
        laid.append(LaidOutNode(n.id, n.kind, _label(n), n.status, x, rank[x] - 1))
    return DagLayout(tuple(laid), edges, max(rank) + 1 if rank else 0, max(rank.values(), default=0))
