"""Trace a map and draw its timeline: one PNG and one self-contained HTML file.

Runs an enrichment-like graph (fetch -> parse -> score) over N items on the chosen engine
with a ``TraceCollector`` callback, prints the per-node summary, and writes
``<out>.png`` (matplotlib, ``pip install 'hypernodes-dist[viz]'``) and ``<out>.html``
(inline SVG, opens anywhere, no network).

    python examples/timeline.py [--engine local|dask|daft] [--items N] [--out PATH]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hypernodes_dist import Graph, GraphEngine, node
from hypernodes_dist.trace import TraceCollector, format_summary, summary, timeline


@node(output_name="page")
def fetch(item: int) -> str:
    time.sleep(0.002 + (item % 7) * 0.0005)  # an I/O-bound call with uneven latency
    return f"item {item} " * 20


@node(output_name="words")
def parse(page: str) -> list[str]:
    return page.split()


@node(output_name="score")
def score(words: list[str]) -> float:
    return sum(len(w) for w in words) / max(1, len(words))


def make_engine(name: str, workers: int):
    if name == "local":
        return GraphEngine(batch_size=25)
    from hypernodes_dist.engines import DaftEngine, DaskEngine

    if name == "dask":
        return DaskEngine(scheduler="processes", num_workers=workers, partition_size=25)
    if name == "dask-threads":
        return DaskEngine(scheduler="threads", num_workers=workers, partition_size=25)
    if name == "daft":
        return DaftEngine(batch_size=25)
    raise SystemExit(f"unknown engine {name!r}: use local, dask, dask-threads or daft")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="dask", help="local | dask | dask-threads | daft")
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--out", default="examples/out/timeline")
    args = ap.parse_args()

    engine = make_engine(args.engine, args.workers)
    collector = TraceCollector()
    graph = Graph([fetch, parse, score], engine=engine, callbacks=[collector])
    t0 = time.perf_counter()
    try:
        result = graph.map({"item": list(range(args.items))}, map_over="item", progress=True)
    finally:
        engine.close()
    elapsed = time.perf_counter() - t0
    trace = collector.trace
    print(f"\n{len(result)} items on {args.engine} in {elapsed:.2f}s; trace: {trace}")
    print(format_summary(summary(trace)))
    tl = timeline(trace)
    out = Path(args.out)
    title = f"{args.items}-item map on {args.engine}"
    written = [tl.to_html(out.with_suffix(".html"), title=title, stats=summary(trace))]
    try:
        written.insert(0, tl.to_png(out.with_suffix(".png"), title=title))
    except ImportError as exc:
        print(f"(no PNG: {exc})")
    print(f"{len(tl.spans)} executions on {len(tl.lanes)} lanes ({len(tl.workers)} workers)")
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
