"""Throughput of a real API workload: a slow, flaky, rate-limited async call per row.

Workload (issue 16): ``rows`` items, one ``async`` call of 5-20 ms per row (the duration
is fixed per row), 5% of the rows fail once with a ``ConnectionError``, the node has
``retries=3, backoff=0.2, concurrency=64``. Each engine runs with its DEFAULT settings,
beside a hand-written ``asyncio`` loop (one ``Semaphore(64)``, the same retries and
back-off) measured in the same run; ``x loop`` = engine time / loop time (target <= 1.3).
The ideal time is ``sum(call durations) / 64`` plus one back-off.

Then the same map with ``batch_size`` / ``partition_size`` of 100, 1,000 and 20,000 on
each engine: the time must not grow with the batch size.

Last, the END-gate map: a graph whose gate may ``END`` beside the same graph with a
branch (sync nodes, 100k rows by default, the local engine): within 1.5x is the target.

Run: ``.venv/bin/python benchmarks/bench_policies.py [--rows 20000] [--engines a,b]
[--sizes 100,1000,20000] [--gate-rows 100000]``. Prints a table and writes
``benchmarks/results/policies.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from hypernodes_bench.tables import machine, print_table, write_results
from hypernodes_dist import END, Graph, GraphEngine, branch, gate, node

RESULTS = Path(__file__).parent / "results"
COLUMNS = ["workload", "engine", "setting", "rows", "seconds", "loop_seconds", "x_loop",
           "ideal_seconds", "x_branch"]
CONCURRENCY = 64
RETRIES = 3
BACKOFF = 0.2
FAIL_EVERY = 20  # 5% of the rows fail once
SIZES = [100, 1_000, 20_000]


# ------------------------------------------------------------------ the workload


def duration(x: int) -> float:
    """The call time of row ``x``: 5-20 ms, fixed per row (every run sees the same load)."""
    return random.Random(x).uniform(0.005, 0.020)


_FAILED: set[int] = set()  # rows that already failed once (per process; retries stay there)


async def call_api(x: int) -> int:
    """The simulated provider: sleeps, and fails the first call of every 20th row."""
    await asyncio.sleep(duration(x))
    if x % FAIL_EVERY == 7 and x not in _FAILED:
        _FAILED.add(x)
        raise ConnectionError(f"provider hiccup on row {x}")
    return x * 2


@node(output_name="y", retries=RETRIES, backoff=BACKOFF, concurrency=CONCURRENCY)
async def enrich(x: int) -> int:
    return await call_api(x)


@node(output_name="z")
def parse(y: int) -> int:
    return y + 1


API = [enrich, parse]


def expected(xs: list[int]) -> list[int]:
    return [x * 2 + 1 for x in xs]


async def _hand_loop(xs: list[int]) -> list[int]:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(x: int) -> int:
        for attempt in range(RETRIES + 1):
            async with sem:
                try:
                    y = await call_api(x)
                    return y + 1
                except ConnectionError:
                    if attempt == RETRIES:
                        raise
            await asyncio.sleep(BACKOFF)
        raise AssertionError("unreachable")

    return list(await asyncio.gather(*(one(x) for x in xs)))


def hand_loop(xs: list[int]) -> list[int]:
    """The hand-written asyncio loop a user would write instead of the library."""
    _FAILED.clear()
    return asyncio.run(_hand_loop(xs))


def ideal(xs: list[int]) -> float:
    return sum(map(duration, xs)) / CONCURRENCY + BACKOFF


# ------------------------------------------------------------------ engines (defaults)


def _dask(**kwargs: Any) -> Any:
    try:
        from hypernodes_dask import DaskEngine
    except ImportError:
        return None
    return DaskEngine(**kwargs)


def _daft(**kwargs: Any) -> Any:
    try:
        from hypernodes_daft import DaftEngine
    except ImportError:
        return None
    return DaftEngine(**kwargs)


# label -> (make engine with default settings, make engine with a given batch size)
SETUPS: dict[str, tuple[Callable[[], Any], Callable[[int], Any]]] = {
    "local": (GraphEngine, lambda b: GraphEngine(batch_size=b)),
    "dask-threads": (lambda: _dask(scheduler="threads"),
                     lambda b: _dask(scheduler="threads", partition_size=b)),
    "dask-processes": (lambda: _dask(scheduler="processes"),
                       lambda b: _dask(scheduler="processes", partition_size=b)),
    "dask-localcluster": (lambda: _dask(scheduler="distributed"),
                          lambda b: _dask(scheduler="distributed", partition_size=b)),
    "daft-native": (lambda: _daft(runner="native"), lambda b: _daft(batch_size=b)),
}


# ------------------------------------------------------------------ measuring


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run_map(engine: Any, xs: list[int]) -> list[int]:
    _FAILED.clear()  # every row fails once again (in this process; workers start afresh)
    res = Graph(API, engine=engine).map({"x": xs}, map_over="x")
    return [r["z"] for r in res]


def bench_api(label: str, engine: Any, xs: list[int], setting: str) -> dict[str, Any]:
    """One engine row; its loop is measured right before it (same machine load)."""
    run_map(engine, xs[:3] + [7])  # start pools/clusters, import the plugin's modules
    loop_s, want = timed(lambda: hand_loop(xs))
    t, got = timed(lambda: run_map(engine, xs))
    assert got == want == expected(xs), f"{label}: wrong results"
    return {"workload": "api", "engine": label, "setting": setting, "rows": len(xs),
            "seconds": round(t, 3), "loop_seconds": round(loop_s, 3),
            "x_loop": round(t / loop_s, 2), "ideal_seconds": round(ideal(xs), 3)}


# ------------------------------------------------------------------ END gate vs branch


@node(output_name="v")
def prep(x: int) -> int:
    return x + 1


@gate
def keep_or_end(v: int) -> Literal["heavy", END]:
    return END if v % 10 == 0 else "heavy"


@branch(when_true="heavy", when_false="drop")
def keep(v: int) -> bool:
    return v % 10 != 0


@node(output_name="w")
def heavy(v: int) -> int:
    return v * 3


@node(output_name="dropped")
def drop(v: int) -> bool:
    return True


@node(output_name="out")
def finish(w: int) -> str:
    return f"{w}!"


GATED = [prep, keep_or_end, heavy, finish]
BRANCHED = [prep, keep, heavy, drop, finish]


def bench_gate(n: int, repeat: int = 2) -> list[dict[str, Any]]:
    xs = list(range(n))
    times = {"branch": float("inf"), "end-gate": float("inf")}
    for _ in range(repeat):  # alternate, so both see the same load
        for label, nodes in (("branch", BRANCHED), ("end-gate", GATED)):
            g = Graph(nodes)
            t, res = timed(lambda g=g: g.map({"x": xs}, map_over="x"))
            assert sum(1 for r in res if "out" in r) == n - n // 10
            times[label] = min(times[label], t)
    base = times["branch"]
    return [{"workload": "gate", "engine": "local", "setting": label, "rows": n,
             "seconds": round(t, 3), "x_branch": round(t / base, 2)}
            for label, t in times.items()]


# ------------------------------------------------------------------ main


def main(rows: int, engines: list[str], sizes: list[int], gate_rows: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    xs = list(range(rows))
    out: list[dict[str, Any]] = []
    for label in engines:
        default, sized = SETUPS[label]
        for setting, make in [("default", default), *((f"batch={b}", lambda b=b, s=sized: s(b))
                                                     for b in sizes)]:
            engine = make()
            if engine is None:
                print(f"skipping {label}: plugin not installed", file=sys.stderr)
                break
            try:
                row = bench_api(label, engine, xs, setting)
            finally:
                engine.close()
            print(row, flush=True)
            out.append(row)
    if gate_rows:
        for row in bench_gate(gate_rows):
            print(row, flush=True)
            out.append(row)
    return {
        "machine": machine(load_before),
        "workload": {"rows": rows, "call_ms": [5, 20], "fail_once": 1 / FAIL_EVERY,
                     "retries": RETRIES, "backoff": BACKOFF, "concurrency": CONCURRENCY},
        "rows": out,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--engines", default=",".join(SETUPS),
                        help=f"comma-separated, from: {', '.join(SETUPS)}")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="batch/partition sizes to sweep ('' for none)")
    parser.add_argument("--gate-rows", type=int, default=100_000, help="0 skips the END bench")
    parser.add_argument("--name", default="policies", help="results/<name>.json")
    args = parser.parse_args()
    report = main(args.rows, [e for e in args.engines.split(",") if e],
                  [int(s) for s in args.sizes.split(",") if s], args.gate_rows)
    print()
    print_table(report["rows"], COLUMNS)
    print(f"\nwrote {write_results(RESULTS, args.name, report)}")
