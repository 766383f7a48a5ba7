"""Engine throughput against the plain Python loop.

Workloads
- ``trivial``: the 3-node graph x -> x+1 -> *2 -> f"{b}-{y}" at 1k / 10k / 100k items
  (measures per-item and per-task overhead; the loop calls the same three functions);
- ``cpu``: three nodes of ~1 ms of pure-Python work each (measures parallel speed-up).

Engines are pluggable: ``SETUPS`` maps an engine label to a small function returning a
ready engine (or ``None`` when its plugin is not installed). Add a row by adding a function.
Engines start (cluster, process pool) and are warmed up before timing: the table reports
steady-state map time, and the start-up time is listed separately.

Run: ``.venv/bin/python benchmarks/bench_engines.py [--engines a,b] [--sizes 1000,10000]``.
Prints a table and writes ``benchmarks/results/engines.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_local import best_of

from hypernodes_bench import workloads as W
from hypernodes_bench.tables import machine
from hypernodes_dist import Graph, GraphEngine

RESULTS = Path(__file__).parent / "results"
TRIVIAL_SIZES = [1_000, 10_000, 100_000]
CPU_ITEMS = 400
CPU_REPEAT = 4


# ------------------------------------------------------------------ workloads
# The graphs live in hypernodes_bench.workloads (shared with `hypernodes-dist bench` and
# benchmarks/peers.py; worker processes import them from the installed package).

TRIVIAL = list(W.TRIVIAL)
CPU = list(W.CPU)
calibrate = W.calibrate


def trivial_loop(xs: list[int], y: str) -> list[str]:
    return W.trivial_loop({"x": xs, "y": y})


def cpu_loop(xs: list[int], work: int) -> list[int]:
    return W.cpu_loop({"x": xs, "work": work})


# ------------------------------------------------------------------ engines (pluggable)


def local() -> Any:
    return GraphEngine(batch_size=1000)


def _dask(**kwargs: Any) -> Any:
    try:
        from hypernodes_dask import DaskEngine
    except ImportError:
        return None
    return DaskEngine(**kwargs)


def dask_threads() -> Any:
    return _dask(scheduler="threads")


def dask_processes() -> Any:
    return _dask(scheduler="processes")


def dask_localcluster() -> Any:
    return _dask(scheduler="distributed",
                 cluster_kwargs={"threads_per_worker": 1, "dashboard_address": None})


def _daft(**kwargs: Any) -> Any:
    try:
        from hypernodes_daft import DaftEngine
    except ImportError:
        return None
    return DaftEngine(**kwargs)


def daft_native() -> Any:
    """Daft's native runner (threads of this process); async I/O rows: bench_daft.py."""
    return _daft(runner="native")


SETUPS: dict[str, Callable[[], Any]] = {
    "local": local,
    "dask-threads": dask_threads,
    "dask-processes": dask_processes,
    "dask-localcluster": dask_localcluster,
    "daft-native": daft_native,
}


# ------------------------------------------------------------------ measuring


def bench_engine(label: str, engine: Any, sizes: list[int], work: int) -> list[dict[str, Any]]:
    """Rows of one engine; each row's loop time is measured right before it (shared machines
    drift: a ratio is only meaningful between two measurements under the same load)."""
    rows = []
    t0 = time.perf_counter()
    warm = Graph(TRIVIAL, engine=engine).map({"x": [1, 2, 3], "y": "y"}, map_over="x")
    assert warm[0]["c"] == "4-y"
    startup = time.perf_counter() - t0

    g = Graph(TRIVIAL, engine=engine)
    for n in sizes:
        xs = list(range(n))
        res = g.map({"x": xs, "y": "y"}, map_over="x")
        assert [r["c"] for r in res[-3:]] == trivial_loop(xs[-3:], "y")
        loop = best_of(lambda xs=xs: trivial_loop(xs, "y"), 5)
        t = best_of(lambda xs=xs: g.map({"x": xs, "y": "y"}, map_over="x"), 3)
        rows.append(_row("trivial", label, n, t, loop, startup))

    g = Graph(CPU, engine=engine)
    xs = list(range(CPU_ITEMS))
    expected = cpu_loop(xs[:2], work)
    loop = t = float("inf")
    for _ in range(CPU_REPEAT):  # alternate, so both see the same (shared-machine) load
        loop = min(loop, best_of(lambda: cpu_loop(xs, work), 1))
        t = min(t, best_of(lambda: _check(g.map({"x": xs, "work": work}, map_over="x"),
                                          expected), 1))
    rows.append(_row("cpu", label, CPU_ITEMS, t, loop, startup))
    return rows


def _check(res: Any, expected: list[int]) -> None:
    assert [r["r"] for r in res[:2]] == expected


def _row(workload: str, engine: str, n: int, t: float, loop: float, startup: float) -> dict:
    return {
        "workload": workload, "engine": engine, "items": n, "seconds": round(t, 4),
        "us_per_item": round(t / n * 1e6, 2), "loop_seconds": round(loop, 4),
        "x_loop_time": round(t / loop, 2), "speedup": round(loop / t, 2),
        "startup_s": round(startup, 2),
    }


def main(engines: list[str], sizes: list[int]) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    work = calibrate()
    rows: list[dict[str, Any]] = []
    for label in engines:
        engine = SETUPS[label]()
        if engine is None:
            print(f"skipping {label}: plugin not installed", file=sys.stderr)
            continue
        try:
            rows.extend(bench_engine(label, engine, sizes, work))
        finally:
            engine.close()
    return {
        "machine": machine(load_before),
        "cpu_work_iterations": work,
        "rows": rows,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = ["workload", "engine", "items", "seconds", "us_per_item", "x_loop_time", "speedup",
            "startup_s"]
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print(" | ".join(c.rjust(w) for c, w in zip(cols, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(r[c]).rjust(w) for c, w in zip(cols, widths)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(SETUPS),
                        help=f"comma-separated, from: {', '.join(SETUPS)}")
    parser.add_argument("--sizes", default=",".join(map(str, TRIVIAL_SIZES)))
    args = parser.parse_args()
    report = main(args.engines.split(","), [int(s) for s in args.sizes.split(",")])
    print_table(report["rows"])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "engines.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {RESULTS / 'engines.json'}")
