"""Cache cost and benefit on the 3-node trivial graph (x -> x+1 -> *2 -> f"{b}-{y}").

For each backend -- ``DiskCache`` (SQLite) and ``ObjectStoreCache`` on a local directory --
in one run: the cold map (a fresh, empty cache: every node result computed and written),
the warm map (``select`` of the leaf output: every item a hit, only the leaf fetched) and
the warm map of every output (every node's results fetched). Ratios are to the uncached map
of the same run. Variants take turns and each row keeps its best of ``--repeat`` runs
(a cold run always starts from an empty cache), so a busy machine skews every row alike.
Each cache's store is opened before the clock starts (importing pyarrow.fs costs a one-time
~0.1-0.3 s per process; it is not a per-entry cost).

Targets (issue 17): cold / uncached <= 5x for DiskCache, <= 3x for ObjectStoreCache on a
local directory; warm >= 100k items/s for both.

Then the users' job (``--api-rows``, default 5,000): ``bench_policies.py``'s async, flaky API
node (5-20 ms, 5% of rows fail once, ``retries=3, backoff=0.2, concurrency=64``) uncached,
with a cold cache and warm, per backend: what the cache costs and saves on real calls.

Run: ``.venv/bin/python benchmarks/bench_cache.py [--items N] [--repeat R] [--api-rows N]``;
prints a table, writes benchmarks/results/cache.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_local import plain_loop, print_table  # noqa: E402

from hypernodes_bench.workloads import double, fmt, inc  # noqa: E402
from hypernodes_dist import DiskCache, Graph, ObjectStoreCache  # noqa: E402

RESULTS = Path(__file__).parent / "results"
BACKENDS: dict[str, Callable[[Path], object]] = {
    "DiskCache": lambda d: DiskCache(d / "disk"),
    "ObjectStoreCache (local dir)": lambda d: ObjectStoreCache(str(d / "objects")),
}
TARGET_COLD = {"DiskCache": 5.0, "ObjectStoreCache (local dir)": 3.0}
TARGET_WARM = 100_000


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one_round(n: int, tmp: Path, best: dict[str, float]) -> None:
    xs = list(range(n))
    inputs = {"x": xs, "y": "y"}

    def keep(label: str, seconds: float) -> None:
        best[label] = min(best.get(label, float("inf")), seconds)

    keep("plain loop", timed(lambda: plain_loop(xs, "y")))
    keep("map, no cache", timed(lambda: Graph([inc, double, fmt]).map(inputs, map_over="x")))
    for name, make in BACKENDS.items():
        where = Path(tempfile.mkdtemp(dir=tmp))
        bench_backend(name, make, where, inputs, keep)
        shutil.rmtree(where, ignore_errors=True)


def bench_backend(name: str, make: Callable[[Path], object], where: Path, inputs: dict,
                  keep: Callable[[str, float], None]) -> None:
    n = len(inputs["x"])
    cache = make(where)
    cache.stats()  # open the store (imports) before the clock starts
    g = Graph([inc, double, fmt], cache=cache)
    keep(f"{name}: cold", timed(lambda: g.map(inputs, map_over="x")))
    warm = Graph([inc, double, fmt], cache=make(where))  # a fresh handle: loads indexes
    warm.cache.stats()
    keep(f"{name}: warm, select leaf", timed(lambda: warm.map(inputs, map_over="x", select=["c"])))
    keep(f"{name}: warm, all outputs", timed(lambda: warm.map(inputs, map_over="x")))
    res = warm.map(inputs, map_over="x", select=["c"])
    assert all(h.cached for h in res[n // 2].history), "the warm map missed"


def api_rows(n: int) -> list[dict]:
    """The API workload uncached, cold and warm on each backend (one run each)."""
    import bench_policies

    xs = list(range(n))
    rows = []

    def row(case: str, graph: Graph) -> float:
        bench_policies._FAILED.clear()  # every row fails once again
        t = timed(lambda: graph.map({"x": xs}, map_over="x"))
        rows.append({"case": f"api: {case}", "items": n, "seconds": round(t, 3),
                     "items_per_s": round(n / t)})
        return t

    base = row("no cache", Graph(bench_policies.API))
    tmp = Path(tempfile.mkdtemp(prefix="hn-bench-cache-api-"))
    try:
        for name, make in BACKENDS.items():
            where = Path(tempfile.mkdtemp(dir=tmp))
            row(f"{name}: cold", Graph(bench_policies.API, cache=make(where)))
            row(f"{name}: warm", Graph(bench_policies.API, cache=make(where)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for r in rows:
        r["ratio_to_no_cache"] = round(r["seconds"] / base, 3)
        r["target"], r["met"] = "", ""
    return rows


def main(n: int, repeat: int) -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="hn-bench-cache-"))
    best: dict[str, float] = {}
    try:
        for _ in range(repeat):
            one_round(n, tmp, best)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = best["map, no cache"]
    rows = []
    for label, t in best.items():
        backend = label.split(":")[0]
        target, met = "", ""
        if label.endswith("cold"):
            target, met = f"<= {TARGET_COLD[backend]:g}x", t / base <= TARGET_COLD[backend]
        elif "warm" in label:
            target, met = f">= {TARGET_WARM:,} items/s", n / t >= TARGET_WARM
        rows.append({"case": label, "items": n, "seconds": round(t, 3),
                     "items_per_s": round(n / t), "ratio_to_no_cache": round(t / base, 2),
                     "target": target, "met": met})
    return rows

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--api-rows", type=int, default=5_000, help="0 skips the API rows")
    args = parser.parse_args()
    rows = main(args.items, args.repeat)
    if args.api_rows:
        rows += api_rows(args.api_rows)
    print_table(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    load = [round(x, 2) for x in os.getloadavg()]  # a busy machine inflates every row
    print(f"load average at the end: {load}")
    (RESULTS / "cache.json").write_text(json.dumps(
        {"benchmark": "cache", "load_average": load, "rows": rows}, indent=2))
