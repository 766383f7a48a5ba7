"""Tracing overhead: a local map of N items with and without tracing, on two workloads:
``trivial`` (3 nodes of ~0.1 us: the worst case) and ``10us`` (3 nodes of ~10 us of pure
Python each, N / 5 items: still far cheaper than any API call).

Rows (CPU seconds of this process, and wall seconds, best of 3):
- ``no callbacks``: events are not built at all (``want_events`` is False);
- ``on_batch no-op``: the executor times every call and ships one ``BatchEvent`` per batch
  (what a Dask/Daft worker sends back) — the core's share of tracing;
- ``TraceCollector, map``: the map with a collector attached (it keeps the batches);
- ``TraceCollector, map + read``: the same, then ``collector.trace`` is read (every batch
  folded into the execution graph: one record per run and per node execution);
- ``per-event no-op``: a callback with ``on_event`` only: each batch expanded into ~2 events
  per execution (what callbacks without ``on_batch`` cost).
``x base`` = row / no callbacks; ``us/exec`` = extra CPU per node execution (N x 3).
Run: ``.venv/bin/python benchmarks/bench_trace.py [N]``; writes results/trace.json.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hypernodes_dist import Graph
from hypernodes_dist.trace import TraceCollector
from hypernodes_dist.workloads import CPU, TRIVIAL, calibrate

RESULTS = Path(__file__).parent / "results"


class BatchNoop:
    def on_batch(self, event: object) -> None:
        pass


class EventNoop:
    def on_event(self, event: object) -> None:
        pass


def measure(fn: Callable[[], object]) -> tuple[float, float]:
    best = (float("inf"), float("inf"))
    for _ in range(3):
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        best = min(best, (time.process_time() - c0, time.perf_counter() - w0))
    return best


def run_map(workload: tuple, callback: object | None, read: bool = False) -> None:
    nodes, inputs = workload
    g = Graph(list(nodes), callbacks=[callback] if callback is not None else [])
    g.map(inputs, map_over="x")
    if read:
        assert len(callback.trace) > len(inputs["x"]) * 4  # type: ignore[union-attr]


def table(name: str, workload: tuple) -> dict:
    n = len(workload[1]["x"])
    rows = {
        "no callbacks": measure(lambda: run_map(workload, None)),
        "on_batch no-op": measure(lambda: run_map(workload, BatchNoop())),
        "TraceCollector, map": measure(lambda: run_map(workload, TraceCollector())),
        "TraceCollector, map + read": measure(
            lambda: run_map(workload, TraceCollector(), read=True)),
        "per-event no-op": measure(lambda: run_map(workload, EventNoop())),
    }
    base_cpu = rows["no callbacks"][0]
    execs = n * 3
    print(f"\n{name}: N={n} items, {execs} node executions")
    print(f"{'variant':28s} {'cpu s':>8s} {'wall s':>8s} {'x base':>7s} {'us/exec':>8s}")
    for label, (cpu, wall) in rows.items():
        print(f"{label:28s} {cpu:8.3f} {wall:8.3f} {cpu / base_cpu:7.2f} "
              f"{(cpu - base_cpu) / execs * 1e6:8.2f}")
    return {"n": n, "rows": {k: {"cpu_s": c, "wall_s": w} for k, (c, w) in rows.items()}}


def main(n: int) -> dict:
    workloads = {
        "trivial": (TRIVIAL, {"x": list(range(n)), "y": "y"}),
        "10us": (CPU, {"x": list(range(n // 5)), "work": calibrate(10e-6)}),
    }
    out = {name: table(name, w) for name, w in workloads.items()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "trace.json").write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
