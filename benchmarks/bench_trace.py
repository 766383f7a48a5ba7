"""Tracing overhead: a local map of N items (3 trivial nodes) with and without tracing.

Rows (CPU seconds of this process, and wall seconds):
- ``no callbacks``: events are not built at all (``want_events`` is False);
- ``no-op callback``: the executor builds every event and ``map`` dispatches them — the
  core's share of tracing;
- ``TraceCollector``: the same plus the trace reducer (buffered, ``reduce_events``);
- ``reduce only``: the reducer alone over the recorded events (GC-frozen input).
Per-execution costs divide by N x 3 node executions (8 events per item).
Run: ``.venv/bin/python benchmarks/bench_trace.py [N]``; writes results/trace.json.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

from hypernodes_dist import Graph
from hypernodes_dist.trace import TraceCollector, empty, reduce_events
from hypernodes_dist.workloads import TRIVIAL

RESULTS = Path(__file__).parent / "results"


class Noop:
    def on_event(self, event: object) -> None:
        pass


class Record:
    def __init__(self) -> None:
        self.events: list = []

    def on_event(self, event: object) -> None:
        self.events.append(event)


def measure(fn) -> tuple[float, float]:
    gc.collect()
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def run_map(callback: object | None, xs: list[int]) -> object:
    g = Graph(list(TRIVIAL), callbacks=[callback] if callback is not None else [])
    g.map({"x": xs, "y": "y"}, map_over="x")
    return getattr(callback, "trace", None)


def main(n: int) -> dict:
    xs = list(range(n))
    rows: dict[str, tuple[float, float]] = {}
    rows["no callbacks"] = measure(lambda: run_map(None, xs))
    rows["no-op callback"] = measure(lambda: run_map(Noop(), xs))
    rows["TraceCollector"] = measure(lambda: run_map(TraceCollector(), xs))
    rec = Record()
    run_map(rec, xs)
    gc.collect()
    gc.freeze()
    events = rec.events

    def reduce_all() -> None:
        trace = empty()
        for i in range(0, len(events), 4096):
            trace = reduce_events(trace, events[i:i + 4096])

    rows["reduce only"] = measure(reduce_all)
    gc.unfreeze()
    base_cpu = rows["no callbacks"][0]
    execs = n * 3
    print(f"N={n} items, {execs} node executions, {len(events)} events")
    print(f"{'variant':18s} {'cpu s':>8s} {'wall s':>8s} {'x base':>7s} {'us/exec':>8s}")
    for name, (cpu, wall) in rows.items():
        extra = (cpu - base_cpu) if name != "reduce only" else cpu
        print(f"{name:18s} {cpu:8.2f} {wall:8.2f} {cpu / base_cpu:7.1f} "
              f"{extra / execs * 1e6:8.2f}")
    core = rows["no-op callback"][0] - base_cpu
    reducer = rows["TraceCollector"][0] - rows["no-op callback"][0]
    print(f"tracing overhead: {(rows['TraceCollector'][0] / base_cpu - 1) * 100:.0f}% "
          f"(core events+dispatch {core:.2f}s, reducer {reducer:.2f}s)")
    out = {"n": n, "events": len(events),
           "rows": {k: {"cpu_s": c, "wall_s": w} for k, (c, w) in rows.items()}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "trace.json").write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
