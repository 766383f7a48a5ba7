"""DiskCache's SQLite page size: bytes written, CPU and wall per workload and page size.

Run: ``python benchmarks/bench_cache_pages.py [--pages 4,8,16,64] [--procs 8 --writes 1000]``.
Each page size runs in a fresh process (``disk.PAGE_BYTES`` is set before the database is
made: a page size is fixed when a database is created). Workloads: many ``set_many`` of one
small entry; segments of 1-60 KiB (kept in the database); 256 KiB segments (files); a cold
lookup (a new ``DiskCache`` on the full directory reads every index) and block reads of
every medium and large entry; ``procs`` spawned processes each calling ``set`` ``writes``
times on one directory (``tests/test_cache_store.py``'s lose-nothing test). Bytes written
are ``write_bytes`` of ``/proc/self/io`` (bytes this process sent to the file system's
page cache), summed over the writing processes; CPU is user + system. Prints a table and
writes ``benchmarks/results/cache_pages.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench_cache_store import print_rows  # noqa: E402

from hypernodes_dist.cache import disk  # noqa: E402
from hypernodes_dist.cache.disk import DiskCache  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "cache_pages.json"
MEDIUM_KIB = (1, 8, 32, 60)


def _io() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes"))


def _measure(fn: Callable[..., Any], *args: Any) -> dict[str, float]:
    """``fn(*args)``'s bytes written, CPU seconds and wall seconds in this process."""
    b0, t0, c0 = _io(), time.perf_counter(), time.process_time()
    fn(*args)
    c1, t1, b1 = time.process_time(), time.perf_counter(), _io()
    return {"bytes": b1 - b0, "cpu": c1 - c0, "wall": t1 - t0}


def _row(case: str, page: int, calls: int, m: dict[str, float]) -> dict[str, Any]:
    return {"case": case, "page_KiB": page >> 10, "calls": calls,
            "KB_written_per_call": round(m["bytes"] / calls / 1000, 1),
            "cpu_us_per_call": round(m["cpu"] / calls * 1e6),
            "wall_us_per_call": round(m["wall"] / calls * 1e6)}


def _set_each(cache: DiskCache, batches: list[dict[str, Any]], node: str) -> None:
    for batch in batches:
        cache.set_many(batch, node=node)


def _writes(cache: DiskCache, page: int, n_small: int, n_medium: int, n_large: int
            ) -> list[dict[str, Any]]:
    rows = []
    small = [{f"s{i}": {"i": i, "text": f"value {i}"}} for i in range(n_small)]
    rows.append(_row("small: set_many of 1 entry", page, n_small,
                     _measure(_set_each, cache, small, "small")))
    for kib in MEDIUM_KIB:
        batches = [{f"m{kib}-{i}": os.urandom((kib << 10) - 200)} for i in range(n_medium)]
        rows.append(_row(f"medium: {kib} KiB segment (database)", page, n_medium,
                         _measure(_set_each, cache, batches, "medium")))
    large = [{f"l{i}": os.urandom(256 << 10)} for i in range(n_large)]
    rows.append(_row("large: 256 KiB segment (file)", page, n_large,
                     _measure(_set_each, cache, large, "large")))
    return rows


def _reads(path: str, page: int, n_small: int, n_medium: int, n_large: int
           ) -> list[dict[str, Any]]:
    cache = DiskCache(path)
    rows = [_row("cold lookup: new cache, get_many 1 key", page, 1,
                 _measure(lambda: cache.get_many(["s0"], node="small")))]
    medium = [f"m{kib}-{i}" for kib in MEDIUM_KIB for i in range(n_medium)]
    got: dict[str, Any] = {}
    rows.append(_row("block reads: get_many of 1-60 KiB entries", page, len(medium),
                     _measure(lambda: got.update(cache.get_many(medium, node="medium")))))
    large = [f"l{i}" for i in range(n_large)]
    rows.append(_row("block reads: get_many of 256 KiB entries", page, n_large,
                     _measure(lambda: got.update(cache.get_many(large, node="large")))))
    assert len(got) == len(medium) + n_large, "entries lost"
    small = [f"s{i}" for i in range(n_small)]
    rows.append(_row("small reads: get_many of 1-entry segments", page, n_small,
                     _measure(lambda: got.update(cache.get_many(small, node="small")))))
    cache.close()
    return rows


def run_page(page: int, n_small: int, n_medium: int, n_large: int) -> list[dict[str, Any]]:
    """Every single-process workload on a new database with ``page``-byte pages."""
    disk.PAGE_BYTES = page
    with tempfile.TemporaryDirectory() as tmp:
        cache = DiskCache(tmp)
        rows = _writes(cache, page, n_small, n_medium, n_large)
        cache.close()
        rows += _reads(tmp, page, n_small, n_medium, n_large)
        size = os.path.getsize(os.path.join(tmp, disk.DB_NAME))
        rows.append({"case": "database file after the writes", "page_KiB": page >> 10,
                     "MB": round(size / 1e6, 2)})
    return rows


def _contend(page: int, path: str, worker: int, count: int) -> tuple[int, float]:
    disk.PAGE_BYTES = page
    b0, c0 = _io(), time.process_time()
    cache = DiskCache(path)
    for i in range(count):
        cache.set(f"w{worker}-{i}", {"w": worker, "i": i, "pad": "x" * 200})
    cache.close()
    return _io() - b0, time.process_time() - c0


def run_contention(page: int, procs: int, count: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        disk.PAGE_BYTES = page
        DiskCache(tmp).close()  # the database exists (with this page size) before the race
        with ctx.Pool(procs) as pool:
            t0 = time.perf_counter()
            res = pool.starmap(_contend, [(page, tmp, w, count) for w in range(procs)])
            wall = time.perf_counter() - t0
        kept = DiskCache(tmp).stats()["entries"]
    calls = procs * count
    assert kept == calls, f"lost {calls - kept}"
    m = {"bytes": sum(b for b, _ in res), "cpu": sum(c for _, c in res), "wall": wall}
    row = _row(f"{procs} procs x {count} set (1 small entry)", page, calls, m)
    row["MB_written_total"] = round(m["bytes"] / 1e6, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", default="4,8,16,64", help="page sizes in KiB")
    parser.add_argument("--small", type=int, default=2000)
    parser.add_argument("--medium", type=int, default=200, help="segments per medium size")
    parser.add_argument("--large", type=int, default=100)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--writes", type=int, default=1000, help="0 skips the contention run")
    args = parser.parse_args()
    pages = [int(p) << 10 for p in args.pages.split(",")]
    ctx = multiprocessing.get_context("spawn")
    rows: list[dict[str, Any]] = []
    for page in pages:
        with ctx.Pool(1) as pool:  # a fresh process: its own /proc/self/io and page size
            rows += pool.apply(run_page, (page, args.small, args.medium, args.large))
        if args.writes:
            rows.append(run_contention(page, args.procs, args.writes))
    rows.sort(key=lambda r: (r["case"], r["page_KiB"]))
    print_rows("DiskCache page size", rows)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load": round(os.getloadavg()[0], 1)},
        "args": vars(args), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
