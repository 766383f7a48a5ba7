"""Size-limited cache: ``DiskCache(size_limit=...)`` against the ``diskcache`` package holding
the same segments with its own size limit and least-recently-used eviction.

Run: ``python benchmarks/bench_cache_eviction.py [--quick]``. Prints a table and writes
``benchmarks/results/cache_eviction.json``.

Workload: N spawned processes share one directory with a size limit; each writes M segments
(one ``set`` / one ``set_many`` of a value of SEG bytes: one node's batch of results) and after
each write reads back R segments it wrote earlier (the reads must keep those recent). Reported:
writes/s and reads/s over all processes, the largest stored size any writer saw right after a
write (``diskcache``: ``volume()``; ``DiskCache``: the segments' bytes and the directory's
files), and how many of its last R segments each writer still finds when it is done (others
keep writing meanwhile: the least recently used of a finished writer may go, as they should).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import platform
import sqlite3
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from hypernodes_dist.cache.disk import DB_NAME, DiskCache  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "cache_eviction.json"


def _stored(path: str) -> tuple[int, int]:
    """(segment bytes per hn_total, bytes of the directory's files) of a DiskCache."""
    con = sqlite3.connect(os.path.join(path, DB_NAME), timeout=60)
    try:
        (total,) = con.execute("SELECT nbytes FROM hn_total").fetchone()
    finally:
        con.close()
    files = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                files += os.path.getsize(os.path.join(root, name))
            except OSError:  # evicted meanwhile
                pass
    return int(total), files


def _worker(kind: str, path: str, limit: int, me: int, m: int, seg: int, r: int,
            out: Any) -> None:
    payload = os.urandom(seg)
    peak = peak_files = 0
    t_write = t_read = 0.0
    if kind == "diskcache":
        import diskcache

        store = diskcache.Cache(path, size_limit=limit, eviction_policy="least-recently-used",
                                timeout=60)
        for i in range(m):
            t0 = time.perf_counter()
            store.set(f"{me}-{i}", payload)
            t1 = time.perf_counter()
            for j in range(max(0, i - r), i):
                store.get(f"{me}-{j}")
            t_read += time.perf_counter() - t1
            t_write += t1 - t0
            peak = max(peak, store.volume())
        peak_files = peak
        kept = sum(f"{me}-{j}" in store for j in range(m - r, m))
        store.close()
    else:
        cache = DiskCache(path, size_limit=limit)
        for i in range(m):
            t0 = time.perf_counter()
            cache.set_many({f"{me}-{i}": payload}, node="n")
            t1 = time.perf_counter()
            cache.get_many([f"{me}-{j}" for j in range(max(0, i - r), i)], node="n")
            t_read += time.perf_counter() - t1
            t_write += t1 - t0
            total, files = _stored(path)
            peak, peak_files = max(peak, total), max(peak_files, files)
        kept = len(cache.get_many([f"{me}-{j}" for j in range(m - r, m)], node="n"))
        cache.close()
    out.put((t_write, t_read, peak, peak_files, kept))


def run(kind: str, n: int, m: int, seg: int, r: int, limit: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        out = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(kind, tmp, limit, me, m, seg, r, out))
                 for me in range(n)]
        for p in procs:
            p.start()
        rows = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
    t_write = sum(row[0] for row in rows) / n
    t_read = sum(row[1] for row in rows) / n
    return {
        "store": kind, "processes": n, "segments": n * m, "segment_bytes": seg, "limit": limit,
        "writes_per_s": round(n * m / t_write, 1) if t_write else None,
        "reads_per_s": round(n * m * r / t_read, 1) if t_read else None,
        "peak_stored": max(row[2] for row in rows),
        "peak_files": max(row[3] for row in rows),
        "recent_kept": f"{sum(row[4] for row in rows)}/{n * r}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, m, seg, r = (2, 60, 256 << 10, 4) if args.quick else (4, 200, 256 << 10, 4)
    limit = 16 << 20
    rows = [run(kind, n, m, seg, r, limit) for kind in ("diskcache", "DiskCache")]
    cols = ["store", "processes", "segments", "writes_per_s", "reads_per_s", "limit",
            "peak_stored", "peak_files", "recent_kept"]
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(str(row[c]) for c in cols))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(),
                                   "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
