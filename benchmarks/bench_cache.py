"""Cache cost and benefit on the 3-node trivial graph (x -> x+1 -> *2 -> f"{b}-{y}").

Rows: cold map without cache, cold map with a fresh DiskCache, warm map (every item a hit,
``select`` of the leaf output), and the plain loop. Also compares the two key strategies
on a warm map: *chain* (downstream keys derive from upstream keys: only the selected
output is fetched) against *value* (every intermediate is fetched and re-hashed, simulated
by a warm map that asks for every output). The "SQLite floor" row is the least any
SQLite-indexed store (diskcache's included) can cost: inserting 3 rows per item (one per
node result) into an in-memory table with no index and no key, in one transaction, with
``executemany`` -- no hashing, no pickling, no disk. Prints a table, writes
benchmarks/results/cache.json. Run: ``.venv/bin/python benchmarks/bench_cache.py [N]``.
"""

from __future__ import annotations

import json
import pickle
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from bench_local import plain_loop, print_table

from hypernodes_bench.workloads import double, fmt, inc
from hypernodes_dist import DiskCache, Graph

RESULTS = Path(__file__).parent / "results"


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def sqlite_floor(n: int, rows_per_item: int = 3) -> float:
    """Seconds to insert ``rows_per_item * n`` small blobs into a bare in-memory table."""
    blobs = [pickle.dumps(f"{i}-y", protocol=5) for i in range(n * rows_per_item)]
    con = sqlite3.connect(":memory:", isolation_level=None)
    con.execute("CREATE TABLE t(v BLOB)")
    t0 = time.perf_counter()
    con.execute("BEGIN")
    con.executemany("INSERT INTO t VALUES (?)", ((b,) for b in blobs))
    con.execute("COMMIT")
    return time.perf_counter() - t0


def main(n: int) -> list[dict]:
    xs = list(range(n))
    inputs = {"x": xs, "y": "y"}
    loop = min(timed(lambda: plain_loop(xs, "y")) for _ in range(3))
    nocache = min(timed(lambda: Graph([inc, double, fmt]).map(inputs, map_over="x")) for _ in range(3))
    tmp = Path(tempfile.mkdtemp(prefix="hn-bench-cache-"))
    try:
        g = Graph([inc, double, fmt], cache=DiskCache(tmp / "c"))
        cold = timed(lambda: g.map(inputs, map_over="x"))
        warm_leaf = min(timed(lambda: g.map(inputs, map_over="x", select=["c"])) for _ in range(3))
        warm_all = min(timed(lambda: g.map(inputs, map_over="x")) for _ in range(3))
        res = g.map(inputs, map_over="x", select=["c"])
        assert all(h.cached for h in res[n // 2].history)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for label, t in [
        ("plain loop", loop),
        ("map, no cache", nocache),
        ("map, cold cache", cold),
        ("map, warm, select leaf (chain keys)", warm_leaf),
        ("map, warm, all outputs (fetch every node)", warm_all),
        ("SQLite floor: 3 bare inserts per item", min(sqlite_floor(n) for _ in range(3))),
    ]:
        rows.append({"case": label, "items": n, "seconds": round(t, 3),
                     "items_per_s": round(n / t), "ratio_to_no_cache": round(t / nocache, 2)})
    return rows


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    rows = main(n)
    print_table(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cache.json").write_text(json.dumps({"benchmark": "cache", "rows": rows}, indent=2))
