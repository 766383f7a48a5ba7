"""Tracing overhead: a map of N items with and without tracing, on every engine, on two
workloads: ``trivial`` (3 nodes of ~0.1 us: the worst case) and ``10us`` (3 nodes of ~10 us
of pure Python each, N / 5 items: still far cheaper than any API call).

Rows (wall seconds, best of 5 rounds in which the variants take turns; the local engine
also reports CPU seconds):
- ``no callbacks``: events are not built at all (``want_events`` is False);
- ``on_batch no-op``: the executor times every call and ships one ``BatchEvent`` per batch
  back to the driver — what tracing costs the workers;
- ``collector + summary``: a ``TraceCollector``, then ``summary(collector.trace)``;
- ``collector + timeline``: the same, then the timeline projected and written as HTML;
- ``collector + records``: the same, then every record of the execution graph built
  (``len(trace.nodes)``: one vertex per run and per node execution, with edges);
- ``per-event no-op`` (local only): a callback with ``on_event`` only, so each batch is
  expanded into ~2 events per execution (what callbacks without ``on_batch`` cost).
``x base`` = row / no callbacks; ``us/exec`` = extra wall time per node execution.
Run: ``.venv/bin/python benchmarks/bench_trace.py [N] [--engines local,dask-threads,...]``;
writes results/trace.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_engines import SETUPS

from hypernodes_bench.workloads import CPU, TRIVIAL, calibrate
from hypernodes_dist import Graph
from hypernodes_dist.trace import TraceCollector, summary, timeline

RESULTS = Path(__file__).parent / "results"
ENGINES = ["local", "dask-threads", "dask-processes", "daft-native"]


class BatchNoop:
    def on_batch(self, event: object) -> None:
        pass


class EventNoop:
    def on_event(self, event: object) -> None:
        pass


def measure(variants: dict[str, Callable[[], object]], rounds: int = 5
            ) -> dict[str, tuple[float, float]]:
    """Best (cpu, wall) seconds of each variant over ``rounds`` rounds (cpu: this process
    only). Variants take turns within a round, so drifting machine load hits them alike."""
    best = {name: (float("inf"), float("inf")) for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            gc.collect()
            c0, w0 = time.process_time(), time.perf_counter()
            fn()
            best[name] = min(best[name], (time.process_time() - c0, time.perf_counter() - w0))
    return best


def _html(collector: TraceCollector) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        timeline(collector.trace).to_html(Path(tmp) / "t.html")


READS: dict[str, Callable[[TraceCollector], object]] = {
    "collector + summary": lambda c: summary(c.trace),
    "collector + timeline": _html,
    "collector + records": lambda c: len(c.trace.nodes),
}


def traced_map(engine: Any, workload: tuple, callback: object | None,
               read: Callable[[Any], object] | None = None) -> None:
    nodes, inputs = workload
    g = Graph(list(nodes), engine=engine, callbacks=[callback] if callback is not None else [])
    g.map(inputs, map_over="x")
    if read is not None:
        read(callback)


def table(label: str, engine: Any, name: str, workload: tuple) -> dict[str, Any]:
    n = len(workload[1]["x"])
    traced_map(engine, (workload[0], {**workload[1], "x": workload[1]["x"][:10]}), None)  # warm

    def row(make: Callable[[], object | None], read: Any = None) -> Callable[[], None]:
        return lambda: traced_map(engine, workload, make(), read)

    variants = {"no callbacks": row(lambda: None), "on_batch no-op": row(BatchNoop)}
    variants.update({what: row(TraceCollector, read) for what, read in READS.items()})
    if label == "local":
        variants["per-event no-op"] = row(EventNoop)
    rows = measure(variants)
    base = rows["no callbacks"][1]
    execs = n * 3
    print(f"\n{label}, {name}: N={n} items, {execs} node executions")
    print(f"{'variant':24s} {'wall s':>8s} {'cpu s':>8s} {'x base':>7s} {'us/exec':>8s}")
    for what, (cpu, wall) in rows.items():
        cpu_s = f"{cpu:8.3f}" if label == "local" else f"{'-':>8s}"
        print(f"{what:24s} {wall:8.3f} {cpu_s} {wall / base:7.2f} "
              f"{(wall - base) / execs * 1e6:8.2f}")
    return {"engine": label, "workload": name, "n": n,
            "rows": {k: {"wall_s": w, "cpu_s": c} for k, (c, w) in rows.items()}}


def main(n: int, engines: list[str]) -> list[dict[str, Any]]:
    workloads = {
        "trivial": (TRIVIAL, {"x": list(range(n)), "y": "y"}),
        "10us": (CPU, {"x": list(range(n // 5)), "work": calibrate(10e-6)}),
    }
    out = []
    for label in engines:
        engine = SETUPS[label]()
        if engine is None:
            print(f"skipping {label}: plugin not installed")
            continue
        try:
            out.extend(table(label, engine, name, w) for name, w in workloads.items())
        finally:
            engine.close()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "trace.json").write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=100_000)
    parser.add_argument("--engines", default=",".join(ENGINES))
    args = parser.parse_args()
    main(args.n, args.engines.split(","))
