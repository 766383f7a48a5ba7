"""The timeline of a trace: every finished execution on lanes per worker, drawn to PNG
(matplotlib, extra ``viz``) or to self-contained HTML (inline SVG: no script, no network).
Executions are merged at the drawing's resolution: a 10^5-item map draws like a small one.
"""

from __future__ import annotations

import heapq
import html
from dataclasses import dataclass
from itertools import accumulate, compress, islice, repeat
from operator import add, attrgetter, gt, itemgetter, le
from pathlib import Path
from typing import Any

from .log import Trace
from .views import NodeStats, format_summary

__all__ = ["Span", "Timeline", "timeline"]


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

    def __init__(self, col: dict[str, list[Any]], lane: list[int], lanes: tuple[str, ...],
                 workers: tuple[str, ...]) -> None:
        self._col, self._lane, self.lanes, self.workers = col, lane, lanes, workers
        self.nodes = tuple(dict.fromkeys(col["node"]))
        self.t0 = col["start"][0] if col["start"] else 0.0
        self.t1 = max(col["end"], default=self.t0)
        self._spans: tuple[Span, ...] | None = None

    @property
    def spans(self) -> tuple[Span, ...]:
        if self._spans is None:
            c = self._col  # a batch's executions have a run-id prefix instead of a run id
            runs = [f"{p}{i}" if r is None else r for r, p, i in zip(c["run"], c["prefix"], c["item"])]
            self._spans = tuple(map(Span, c["node"], runs, c["item"], c["iteration"], c["worker"],
                                    self._lane, c["start"], c["end"], c["status"], c["cached"]))
        return self._spans

    def __len__(self) -> int:
        return len(self._lane)

    @property
    def duration(self) -> float:
        return self.t1 - self.t0

    def blocks(self, resolution: float) -> list[tuple[int, str, str, float, float, int]]:
        """Executions merged per (lane, node, class) where closer than ``resolution`` s:
        ``(lane, node, class, start, end, count)`` with class ``ran|cached|error``."""
        c, groups, out = self._col, {}, []
        for k, key in enumerate(zip(self._lane, c["node"], map(_class, c["status"], c["cached"]))):
            found = groups.get(key)
            if found is None:
                groups[key] = [k]
            else:
                found.append(k)
        for (lane, node, cls), which in groups.items():
            starts, reach = _pick(which, c["start"]), list(accumulate(_pick(which, c["end"]), max))
            # a block ends before execution j when j starts beyond its reach + resolution
            cuts = list(compress(range(1, len(starts)), map(
                gt, islice(starts, 1, None), map(add, reach, repeat(resolution)))))
            for a, b in zip([0, *cuts], [*cuts, len(starts)]):
                out.append((lane, node, cls, starts[a], reach[b - 1], b - a))
        return out

    def to_png(self, path: str | Path, *, title: str | None = None, width: float = 12.0) -> Path:
        return _png(self, Path(path), title, width)

    def to_svg(self, *, width: int = 1200, title: str | None = None) -> str:
        return _svg(self, width, title)

    def to_html(self, path: str | Path, *, title: str | None = None,
                stats: dict[str, NodeStats] | None = None) -> Path:
        esc = html.escape
        table = f"<h2>Per node</h2><pre>{esc(format_summary(stats))}</pre>" if stats else ""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>'
            f"{esc(title or 'hypernodes-dist timeline')}</title><style>body{{font-family:"
            "sans-serif;margin:16px}pre{font-size:12px}svg rect:hover{stroke:#000;"
            f"stroke-width:1}}</style></head><body>{self.to_svg(title=title)}{table}"
            "</body></html>\n", encoding="utf-8")
        return path

    def __repr__(self) -> str:
        return f"Timeline({len(self)} executions, {len(self.lanes)} lanes, {self.duration:.3f} s)"


def timeline(trace: Trace, *, max_lanes_per_worker: int = 32) -> Timeline:
    """Start/end of every finished execution, with its worker and a drawing lane."""
    col = _columns(trace)
    by_worker: dict[str, list[int]] = {}
    for k, worker in enumerate(col["worker"]):
        by_worker.setdefault(worker, []).append(k)
    lane, lanes = [0] * len(col["start"]), []
    for worker in sorted(by_worker):
        used = _assign_lanes(by_worker[worker], col["start"], col["end"], lane, len(lanes),
                             max_lanes_per_worker)
        lanes.extend(worker if used == 1 else f"{worker} #{i}" for i in range(used))
    return Timeline(col, lane, tuple(lanes), tuple(sorted(by_worker)))


_RECORD_COLUMNS = {"node": "node_id", "run": "run_id", "item": "item_index",
                   "iteration": "iteration", "start": "started_at", "status": "status"}


def _columns(trace: Trace) -> dict[str, list[Any]]:
    """Finished executions as parallel columns, sorted by start. Records are read column by
    column; a map batch's executions keep their run-id ``prefix`` (``run`` None)."""
    records, batches = trace.columns()
    done = [r for r in records
            if r.kind == "node" and r.started_at is not None and r.status in ("complete", "error")]
    col = {name: list(map(attrgetter(f), done)) for name, f in _RECORD_COLUMNS.items()}
    col["prefix"] = [None] * len(done)
    col["worker"] = [w or "driver" for w in map(attrgetter("worker"), done)]
    col["end"] = [s + (d or 0.0) / 1000.0
                  for s, d in zip(col["start"], map(attrgetter("duration_ms"), done))]
    col["cached"] = list(map(bool, map(attrgetter("cached"), done)))
    for event in batches:
        for part in event.parts:
            n, (starts, ends) = len(part.items), event.wall_times(part)
            for name, values in (
                    ("node", repeat(part.node_id, n)), ("run", repeat(None, n)),
                    ("prefix", repeat(event.run_id, n)), ("iteration", repeat(0, n)),
                    ("item", map(add, part.items, repeat(event.offset))), ("start", starts),
                    ("worker", repeat(event.worker or "driver", n)), ("end", ends),
                    ("status", repeat("complete", n)), ("cached", repeat(part.cached, n))):
                col[name].extend(values)
    start = col["start"]
    if not all(map(le, start, islice(start, 1, None))):
        order = sorted(range(len(start)), key=start.__getitem__)
        col = {name: _pick(order, values) for name, values in col.items()}
    return col


_TOUCH = 1e-6


def _assign_lanes(which: list[int], starts: list[float], ends: list[float], lane: list[int],
                  base: int, most: int) -> int:
    """Put executions ``which`` (sorted by start) of one worker on lanes ``base..``: an
    execution takes the lane that freed first, or a new one while fewer than ``most``.
    Returns how many lanes were used. Overlaps under ``_TOUCH`` are rounding, not
    concurrency (wall-clock seconds near 1.8e9 are floats spaced ~0.24 us apart)."""
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


def _class(status: str, cached: bool) -> str:
    return "error" if status == "error" else ("cached" if cached else "ran")


def _pick(which: list[int], column: list[Any]) -> list[Any]:
    """``[column[k] for k in which]`` at C speed."""
    return list(itemgetter(*which)(column)) if len(which) > 1 else [column[k] for k in which]


_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
            "#ff9da7", "#bab0ac", "#86bcb6", "#8cd17d", "#d4a6c8")
_ERROR = "#d62728"


def _colors(tl: Timeline) -> dict[str, str]:
    return {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(tl.nodes)}


def _title(tl: Timeline, title: str | None) -> str:
    return (f"{title or 'hypernodes-dist timeline'}: {len(tl)} executions, "
            f"{len(tl.workers)} worker(s), {tl.duration:.3f} s")


def _png(tl: Timeline, path: Path, title: str | None, width: float) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("a PNG timeline needs matplotlib: pip install 'hypernodes-dist[viz]' "
                          "(the HTML timeline needs nothing)") from exc
    colors, n_lanes, span = _colors(tl), max(1, len(tl.lanes)), max(tl.duration, 1e-6)
    fig, ax = plt.subplots(figsize=(width, min(40.0, max(2.8, 0.32 * n_lanes + 1.8))), dpi=100)
    resolution = span / (width * 100)  # about one pixel
    for lane, node, cls, start, end, _count in tl.blocks(resolution):
        ax.broken_barh([(start - tl.t0, max(end - start, resolution * 1.5))], (lane - 0.4, 0.8),
                       facecolors=_ERROR if cls == "error" else colors[node],
                       alpha=0.35 if cls == "cached" else 0.95,
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


def _svg(tl: Timeline, width: int, title: str | None) -> str:
    colors, esc = _colors(tl), html.escape
    label_w, lane_h, top, legend_w = 190, 18, 34, 150
    plot_w, n_lanes = max(200, width - label_w - legend_w - 20), max(1, len(tl.lanes))
    span = max(tl.duration, 1e-6)
    scale, axis_y = plot_w / span, top + n_lanes * lane_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{axis_y + 40}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="8" y="18" font-size="13" font-weight="bold">{esc(_title(tl, title))}</text>']
    for i, lane in enumerate(tl.lanes):
        y = top + i * lane_h
        out.append(f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{lane_h}" '
                   f'fill="{"#f6f6f6" if i % 2 == 0 else "#ffffff"}"/>'
                   f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{esc(lane)}</text>')
    for lane, node, cls, start, end, count in tl.blocks(1.0 / scale):
        tip = (f"{node} ({cls}) x{count}: {start - tl.t0:.6f}s - {end - tl.t0:.6f}s "
               f"on {tl.lanes[lane]}")
        out.append(f'<rect x="{label_w + (start - tl.t0) * scale:.2f}" y="{top + lane * lane_h + 2}" '
                   f'width="{max((end - start) * scale, 1.0):.2f}" height="{lane_h - 4}" '
                   f'fill="{_ERROR if cls == "error" else colors[node]}" '
                   f'fill-opacity="{"0.4" if cls == "cached" else "0.95"}">'
                   f"<title>{esc(tip)}</title></rect>")
    for k in range(6):
        x = label_w + plot_w * k / 5
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{axis_y}" stroke="#ccc"/>'
                   f'<text x="{x:.1f}" y="{axis_y + 14}" text-anchor="middle">'
                   f"{span * k / 5:.3f}s</text>")
    legend = [(n, colors[n], "0.95") for n in tl.nodes]
    for i, (name, color, opacity) in enumerate(
            [*legend, ("cache hit", "#999999", "0.4"), ("error", _ERROR, "0.95")]):
        x, y = label_w + plot_w + 16, top + i * 16
        out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{color}" '
                   f'fill-opacity="{opacity}"/><text x="{x + 16}" y="{y + 10}">{esc(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)
