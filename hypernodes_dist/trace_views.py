"""Projections of a trace: ``summary``, ``timeline`` (PNG / self-contained HTML), ``dag``.

Projections only read a trace; they never change it. The timeline renders to PNG with
matplotlib (optional extra ``viz``) and to HTML with an inline SVG (no JavaScript, no CDN,
no dependency). Long timelines are merged at the drawing's resolution, so a 10^5-item map
draws as fast as a small one.
"""

from __future__ import annotations

import heapq
import html
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, islice, repeat
from operator import add, gt, itemgetter, le
from pathlib import Path
from typing import Any

from hypernodes_dist.trace_store import (
    _CACHED,
    _DURATION,
    _ITEM,
    _ITER,
    _KIND,
    _NODE,
    _RUN,
    _STARTED,
    _STATUS,
    _WORKER,
    Edge,
    Trace,
    TraceNode,
)

__all__ = [
    "NodeStats",
    "summary",
    "format_summary",
    "Span",
    "Timeline",
    "timeline",
    "write_timeline",
    "LaidOutNode",
    "DagLayout",
    "dag",
]

_FINISHED = ("complete", "error")


# ============================================================================ summary


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


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0.0 when empty)."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[rank - 1])


def summary(trace: Trace) -> dict[str, NodeStats]:
    """Per graph node: executions, cache hits, errors, retries, p50/p95/max duration."""
    records, batches = trace._columns()
    acc: dict[str, list[Any]] = {}  # name -> [ran, cached, errors, retries, skipped, durations]
    for r in records:
        if r[_KIND] != "node":
            continue
        a = acc.get(r[_NODE])
        if a is None:
            a = acc[r[_NODE]] = [0, 0, 0, 0, 0, []]
        status = r[_STATUS]
        if status == "error":
            a[2] += 1
        elif status == "skipped":
            a[4] += 1
        elif status == "complete":
            if r[_CACHED]:
                a[1] += 1
            else:
                a[0] += 1
                if r[_DURATION] is not None:
                    a[5].append(r[_DURATION])
        a[3] += max(0, r[15] - 1)  # attempts - 1
    for event in batches:  # map batches read as columns: complete, one attempt each
        for part in event.parts:
            a = acc.get(part.node_id)
            if a is None:
                a = acc[part.node_id] = [0, 0, 0, 0, 0, []]
            if part.cached:
                a[1] += len(part.items)
            else:
                a[0] += len(part.items)
                a[5].extend(event.durations(part))
    out: dict[str, NodeStats] = {}
    for name, (ran, cached, errors, retries, skipped, durations) in acc.items():
        durations.sort()
        out[name] = NodeStats(
            name, ran + cached + errors, ran, cached, errors, retries, skipped,
            _percentile(durations, 50), _percentile(durations, 95),
            float(durations[-1]) if durations else 0.0, float(sum(durations)),
        )
    return out


def format_summary(stats: dict[str, NodeStats]) -> str:
    """A plain-text table of ``summary(trace)``."""
    head = ("node", "execs", "ran", "cached", "errors", "retries", "p50 ms", "p95 ms", "max ms")
    rows = [head] + [
        (s.node, str(s.executions), str(s.ran), str(s.cached), str(s.errors), str(s.retries),
         f"{s.p50_ms:.3f}", f"{s.p95_ms:.3f}", f"{s.max_ms:.3f}")
        for s in stats.values()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in rows
    )


# ============================================================================ timeline


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


class _Executions:
    """Finished executions as parallel columns. A batch's executions keep their run-id
    prefix (``prefix``, with ``run`` None) until ``Span``s are built."""

    __slots__ = ("node", "run", "prefix", "item", "iteration", "worker", "start", "end",
                 "status", "cached")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, [])

    def __len__(self) -> int:
        return len(self.start)

    def add_records(self, records: list[tuple[Any, ...]]) -> None:
        """Finished executions stored as records (``TraceNode`` layout), column by column."""
        def field(i: int) -> Iterator[Any]:
            return map(itemgetter(i), records)

        starts = list(field(_STARTED))
        self.node.extend(field(_NODE))
        self.run.extend(field(_RUN))
        self.prefix.extend(repeat(None, len(records)))
        self.item.extend(field(_ITEM))
        self.iteration.extend(field(_ITER))
        self.worker.extend(w or "driver" for w in field(_WORKER))
        self.start.extend(starts)
        self.end.extend(s + (d or 0.0) / 1000.0 for s, d in zip(starts, field(_DURATION)))
        self.status.extend(field(_STATUS))
        self.cached.extend(map(bool, field(_CACHED)))

    def add_columns(self, event: Any, part: Any) -> None:
        """``part``'s executions (node columns of map batch ``event``)."""
        n = len(part.items)
        starts, ends = event.wall_times(part)
        self.node.extend(repeat(part.node_id, n))
        self.run.extend(repeat(None, n))
        self.prefix.extend(repeat(event.run_id, n))
        self.item.extend(map(add, part.items, repeat(event.offset)))
        self.iteration.extend(repeat(0, n))
        self.worker.extend(repeat(event.worker or "driver", n))
        self.start.extend(starts)
        self.end.extend(ends)
        self.status.extend(repeat("complete", n))
        self.cached.extend(repeat(part.cached, n))

    def sort_by_start(self) -> None:
        """Order every column by start (stable)."""
        start = self.start
        if all(map(le, start, islice(start, 1, None))):
            return
        order = sorted(range(len(start)), key=start.__getitem__)
        for name in self.__slots__:
            setattr(self, name, _pick(order, getattr(self, name)))

    def runs(self) -> list[str]:
        return [run if run is not None else f"{prefix}{item}"
                for run, prefix, item in zip(self.run, self.prefix, self.item)]


class Timeline:
    """Executions sorted by start, on lanes: one per worker, split where executions
    overlap. Stored as columns; ``spans`` builds the ``Span`` objects on first use."""

    def __init__(self, ex: _Executions, lane: list[int], lanes: tuple[str, ...],
                 nodes: tuple[str, ...], workers: tuple[str, ...]) -> None:
        self._ex, self._lane = ex, lane
        self.lanes, self.nodes, self.workers = lanes, nodes, workers
        self.t0 = ex.start[0] if ex.start else 0.0
        self.t1 = max(ex.end, default=self.t0)
        self._spans: tuple[Span, ...] | None = None

    @property
    def spans(self) -> tuple[Span, ...]:
        if self._spans is None:
            ex = self._ex
            self._spans = tuple(map(Span, ex.node, ex.runs(), ex.item, ex.iteration, ex.worker,
                                    self._lane, ex.start, ex.end, ex.status, ex.cached))
        return self._spans

    def __len__(self) -> int:
        return len(self._ex)

    @property
    def duration(self) -> float:
        return self.t1 - self.t0

    def to_png(self, path: str | Path, *, title: str | None = None, width: float = 12.0) -> Path:
        return _render_png(self, Path(path), title, width)

    def to_svg(self, *, width: int = 1200, title: str | None = None) -> str:
        return _render_svg(self, width, title)

    def to_html(self, path: str | Path, *, title: str | None = None,
                stats: dict[str, NodeStats] | None = None) -> Path:
        return _render_html(self, Path(path), title, stats)

    def __repr__(self) -> str:
        return (f"Timeline({len(self)} executions, {len(self.lanes)} lanes, "
                f"{self.duration:.3f} s)")


def timeline(trace: Trace, *, max_lanes_per_worker: int = 32) -> Timeline:
    """Start/end of every finished execution, with its worker and a drawing lane."""
    records, batches = trace._columns()
    ex = _Executions()
    ex.add_records([r for r in records if r[_KIND] == "node" and r[_STARTED] is not None
                    and r[_STATUS] in _FINISHED])
    for event in batches:
        for part in event.parts:
            ex.add_columns(event, part)
    ex.sort_by_start()
    by_worker: dict[str, list[int]] = {}
    for k, worker in enumerate(ex.worker):
        by_worker.setdefault(worker, []).append(k)
    lane = [0] * len(ex.start)
    lanes: list[str] = []
    for worker in sorted(by_worker):
        used = _assign_lanes(by_worker[worker], ex.start, ex.end, lane, len(lanes),
                             max_lanes_per_worker)
        lanes.extend(worker if used == 1 else f"{worker} #{i}" for i in range(used))
    return Timeline(ex, lane, tuple(lanes), tuple(dict.fromkeys(ex.node)), tuple(sorted(by_worker)))


_TOUCH = 1e-6


def _assign_lanes(which: list[int], starts: list[float], ends: list[float], lane: list[int],
                  base: int, most: int) -> int:
    """Put executions ``which`` (sorted by start) of one worker on lanes ``base..``: an
    execution takes the lane that freed first, or a new one while fewer than ``most``.
    Returns how many lanes were used. Overlaps under ``_TOUCH`` are rounding, not
    concurrency (wall-clock seconds near 1.8e9 are floats spaced ~0.24 us apart)."""
    first = _pick(which, starts)
    last = list(accumulate(_pick(which, ends), max))
    if all(map(le, last, map(add, islice(first, 1, None), repeat(_TOUCH)))):  # in turn
        for k in which:
            lane[k] = base
        return 1
    free: list[tuple[float, int]] = []  # (end, sub-lane) of every sub-lane in use
    used = 0
    for k in which:
        start = starts[k]
        if free and free[0][0] <= start + _TOUCH:
            sub = heapq.heappop(free)[1]
        elif used < most:
            sub, used = used, used + 1
        else:  # too many overlapping: share the lane that frees first
            sub = heapq.heappop(free)[1]
        heapq.heappush(free, (max(ends[k], start), sub))
        lane[k] = base + sub
    return used


def write_timeline(trace: Trace, png: str | Path | None = None, html_path: str | Path | None = None,
                   *, title: str | None = None) -> Timeline:
    """Project ``trace`` to a timeline and write it as PNG and/or self-contained HTML."""
    tl = timeline(trace)
    if png is not None:
        tl.to_png(png, title=title)
    if html_path is not None:
        tl.to_html(html_path, title=title, stats=summary(trace))
    return tl


_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
            "#ff9da7", "#bab0ac", "#86bcb6", "#8cd17d", "#d4a6c8")
_ERROR = "#d62728"


def _colors(tl: Timeline) -> dict[str, str]:
    return {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(tl.nodes)}


def _blocks(tl: Timeline, resolution: float) -> list[tuple[int, str, str, float, float, int]]:
    """Executions merged per (lane, node, class) where closer than ``resolution`` seconds.

    Returns ``(lane, node, class, start, end, count)`` with class ``ran|cached|error``.
    """
    ex = tl._ex
    out = []
    for (lane, node, cls), which in _groups(tl).items():
        starts, ends = _pick(which, ex.start), _pick(which, ex.end)  # sorted by start
        reach = list(accumulate(ends, max))  # the furthest end so far
        # a block ends before execution j when j starts beyond the block's reach + resolution
        cuts = list(compress(range(1, len(starts)), map(
            gt, islice(starts, 1, None), map(add, reach, repeat(resolution)))))
        for a, b in zip([0, *cuts], [*cuts, len(starts)]):
            out.append((lane, node, cls, starts[a], reach[b - 1], b - a))
    return out


def _groups(tl: Timeline) -> dict[tuple[int, str, str], list[int]]:
    """Positions of the executions of each (lane, node, class), in start order."""
    ex = tl._ex
    groups: dict[tuple[int, str, str], list[int]] = {}
    for k, key in enumerate(zip(tl._lane, ex.node, map(_class, ex.status, ex.cached))):
        found = groups.get(key)
        if found is None:
            groups[key] = [k]
        else:
            found.append(k)
    return groups


def _class(status: str, cached: bool) -> str:
    return "error" if status == "error" else ("cached" if cached else "ran")


def _pick(which: list[int], column: list[Any]) -> list[Any]:
    """``[column[k] for k in which]`` at C speed."""
    return list(itemgetter(*which)(column)) if len(which) > 1 else [column[k] for k in which]


def _title(tl: Timeline, title: str | None) -> str:
    head = title or "hypernodes-dist timeline"
    return (f"{head}: {len(tl)} executions, {len(tl.workers)} worker(s), "
            f"{tl.duration:.3f} s")


def _render_png(tl: Timeline, path: Path, title: str | None, width: float) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "a PNG timeline needs matplotlib: pip install 'hypernodes-dist[viz]' "
            "(the HTML timeline needs nothing)"
        ) from exc
    colors = _colors(tl)
    n_lanes = max(1, len(tl.lanes))
    height = min(40.0, max(2.8, 0.32 * n_lanes + 1.8))
    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    span = max(tl.duration, 1e-6)
    resolution = span / (width * 100)  # about one pixel
    min_w = resolution * 1.5
    for lane, node, cls, start, end, _count in _blocks(tl, resolution):
        color = _ERROR if cls == "error" else colors[node]
        ax.broken_barh([(start - tl.t0, max(end - start, min_w))], (lane - 0.4, 0.8),
                       facecolors=color, alpha=0.35 if cls == "cached" else 0.95,
                       hatch="///" if cls == "cached" else None, edgecolor="none")
    ax.set_yticks(range(n_lanes))
    ax.set_yticklabels(list(tl.lanes) or ["-"], fontsize=8)
    ax.set_ylim(n_lanes - 0.5, -0.5)
    ax.set_xlim(0, span * 1.01)
    ax.set_xlabel("seconds since the first execution started")
    ax.set_title(_title(tl, title), fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(facecolor=colors[n], label=n) for n in tl.nodes]
    handles += [Patch(facecolor="#999999", alpha=0.35, hatch="///", label="cache hit"),
                Patch(facecolor=_ERROR, label="error")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _render_svg(tl: Timeline, width: int, title: str | None) -> str:
    colors = _colors(tl)
    label_w, lane_h, top, legend_w = 190, 18, 34, 150
    plot_w = max(200, width - label_w - legend_w - 20)
    n_lanes = max(1, len(tl.lanes))
    height = top + n_lanes * lane_h + 40
    span = max(tl.duration, 1e-6)
    scale = plot_w / span
    esc = html.escape
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<text x="8" y="18" font-size="13" font-weight="bold">{esc(_title(tl, title))}</text>',
    ]
    for i, lane in enumerate(tl.lanes):
        y = top + i * lane_h
        fill = "#f6f6f6" if i % 2 == 0 else "#ffffff"
        parts.append(f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{lane_h}" fill="{fill}"/>')
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{esc(lane)}</text>')
    for lane, node, cls, start, end, count in _blocks(tl, 1.0 / scale):
        x = label_w + (start - tl.t0) * scale
        w = max((end - start) * scale, 1.0)
        y = top + lane * lane_h + 2
        color = _ERROR if cls == "error" else colors[node]
        opacity = "0.4" if cls == "cached" else "0.95"
        tip = (f"{node} ({cls}) x{count}: {start - tl.t0:.6f}s - {end - tl.t0:.6f}s "
               f"on {tl.lanes[lane]}")
        parts.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{lane_h - 4}" '
                     f'fill="{color}" fill-opacity="{opacity}"><title>{esc(tip)}</title></rect>')
    axis_y = top + n_lanes * lane_h
    for k in range(6):
        x = label_w + plot_w * k / 5
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{axis_y}" stroke="#ccc"/>')
        parts.append(f'<text x="{x:.1f}" y="{axis_y + 14}" text-anchor="middle">'
                     f'{span * k / 5:.3f}s</text>')
    lx = label_w + plot_w + 16
    items = [(n, colors[n], "0.95") for n in tl.nodes]
    items += [("cache hit", "#999999", "0.4"), ("error", _ERROR, "0.95")]
    for i, (name, color, opacity) in enumerate(items):
        y = top + i * 16
        parts.append(f'<rect x="{lx}" y="{y}" width="12" height="12" fill="{color}" '
                     f'fill-opacity="{opacity}"/>')
        parts.append(f'<text x="{lx + 16}" y="{y + 10}">{esc(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _render_html(tl: Timeline, path: Path, title: str | None,
                 stats: dict[str, NodeStats] | None) -> Path:
    esc = html.escape
    table = ""
    if stats:
        table = ("<h2>Per node</h2><pre>" + esc(format_summary(stats)) + "</pre>")
    doc = (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{esc(title or 'hypernodes-dist timeline')}</title>"
        "<style>body{font-family:sans-serif;margin:16px}pre{font-size:12px}"
        "svg rect:hover{stroke:#000;stroke-width:1}</style></head><body>"
        f"{tl.to_svg(title=title)}{table}</body></html>\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc, encoding="utf-8")
    return path


# ============================================================================ dag


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
    data = trace._data()
    depth: dict[str, int] = {}
    for src, dst, _kind in data.edges:  # a vertex's edges arrive after its source exists
        d = depth.get(src, 0) + 1
        if d > depth.get(dst, 0):
            depth[dst] = d
    rank: dict[int, int] = {}
    laid = []
    for key, r in data.nodes.items():
        x = depth.get(key, 0)
        y = rank.get(x, 0)
        rank[x] = y + 1
        n = TraceNode._make(r)
        laid.append(LaidOutNode(key, n.kind, _label(n), n.status, x, y))
    edges = tuple(Edge(*e) for e in data.edges)
    return DagLayout(tuple(laid), edges, (max(rank) + 1) if rank else 0, max(rank.values(), default=0))
