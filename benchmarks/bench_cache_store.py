"""Micro-benchmark of the cache layer: hash_value, DiskCache get_many/set_many, contention.

Run: ``python benchmarks/bench_cache_store.py [--quick]``. Prints a table and writes
``benchmarks/results/cache_store.json``. The contention section compares diskcache's
``FanoutCache`` (defaults: 8 shards, 10 ms timeout; ``set`` swallows timeouts) with a plain
``Cache(timeout=60)`` and with ``DiskCache``: N spawned processes each write M keys to one
directory, then the surviving entries are counted. (``DiskCache`` no longer builds on the
``diskcache`` package: one SQLite row per batch of results, see ``hypernodes_dist.cache.disk``;
``diskcache`` is a test/benchmark dependency for this comparison only.)
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
import timeit
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from hypernodes_dist.cache.disk import DiskCache  # noqa: E402
from hypernodes_dist.cache.hashing import hash_value  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "cache_store.json"


def _us_per_call(fn: Callable[[], Any], number: int) -> float:
    best = min(timeit.repeat(fn, number=number, repeat=5))
    return best / number * 1e6


def bench_hash(quick: bool) -> list[dict[str, Any]]:
    n = 20_000 if quick else 200_000
    cases: list[tuple[str, Any, int]] = [
        ("int", 12345, n),
        ("short str", "hello world", n),
        ("float", 3.14, n),
        ("None", None, n),
        ("small dict (2 keys)", {"a": 1, "b": "x"}, n // 10),
        ("list of 10 ints", list(range(10)), n // 10),
        ("1 KiB str", "x" * 1024, n // 10),
    ]
    try:
        import numpy as np

        cases.append(("numpy 1 MiB float64", np.random.default_rng(0).random(131072), 200))
    except ImportError:
        pass
    try:
        import pandas as pd

        df = pd.DataFrame({"a": range(10_000), "b": [f"s{i}" for i in range(10_000)]})
        cases.append(("pandas 10k rows x 2", df, 50))
    except ImportError:
        pass
    noop = _us_per_call(lambda: None, n)
    rows = []
    for name, value, number in cases:
        us = _us_per_call(lambda v=value: hash_value(v), number) - noop
        rows.append({"case": name, "us_per_call": round(us, 3)})
    return rows


def bench_store(quick: bool) -> list[dict[str, Any]]:
    rows = []
    batch = 1000
    rounds = 3 if quick else 10
    with tempfile.TemporaryDirectory() as tmp:
        cache = DiskCache(tmp)
        items = [
            {f"k{r}-{i}": {"i": i, "text": f"value {i}"} for i in range(batch)}
            for r in range(rounds)
        ]
        t0 = time.perf_counter()
        for chunk in items:
            cache.set_many(chunk)
        set_rate = batch * rounds / (time.perf_counter() - t0)
        keys = [list(chunk) for chunk in items]
        t0 = time.perf_counter()
        for ks in keys:
            assert len(cache.get_many(ks)) == batch
        get_rate = batch * rounds / (time.perf_counter() - t0)
        misses = [[f"miss{r}-{i}" for i in range(batch)] for r in range(rounds)]
        t0 = time.perf_counter()
        for ks in misses:
            assert cache.get_many(ks) == {}
        miss_rate = batch * rounds / (time.perf_counter() - t0)
        rows += [
            {"case": "set_many 1000 small", "keys_per_s": round(set_rate)},
            {"case": "get_many 1000 small hits", "keys_per_s": round(get_rate)},
            {"case": "get_many 1000 misses", "keys_per_s": round(miss_rate)},
        ]
        big = {f"big{i}": os.urandom(1 << 20) for i in range(5 if quick else 20)}
        t0 = time.perf_counter()
        cache.set_many(big)
        set_mb = len(big) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert len(cache.get_many(list(big))) == len(big)
        get_mb = len(big) / (time.perf_counter() - t0)
        rows += [
            {"case": "set_many 1 MiB values", "MiB_per_s": round(set_mb, 1)},
            {"case": "get_many 1 MiB values", "MiB_per_s": round(get_mb, 1)},
        ]
        cache.close()
    return rows


def _contend(kind: str, path: str, worker: int, count: int) -> tuple[int, int]:
    """Write ``count`` keys; return (calls that reported failure, exceptions raised)."""
    import diskcache

    failed = errors = 0
    if kind == "FanoutCache(defaults)":
        store: Any = diskcache.FanoutCache(path)
    elif kind == "Cache(timeout=60)":
        store = diskcache.Cache(path, timeout=60)
    else:
        store = DiskCache(path)
    for i in range(count):
        key, value = f"w{worker}-{i}", {"w": worker, "i": i, "pad": "x" * 200}
        try:
            if isinstance(store, DiskCache):
                store.set(key, value)
            elif store.set(key, value) is False:
                failed += 1
        except Exception:  # noqa: BLE001 - counted, that is the point
            errors += 1
    store.close()
    return failed, errors


def bench_contention(procs: int, count: int) -> list[dict[str, Any]]:
    import diskcache

    rows = []
    ctx = multiprocessing.get_context("spawn")
    for kind in ("FanoutCache(defaults)", "Cache(timeout=60)", "DiskCache"):
        with tempfile.TemporaryDirectory() as tmp:
            with ctx.Pool(procs) as pool:
                t0 = time.perf_counter()
                res = pool.starmap(_contend, [(kind, tmp, w, count) for w in range(procs)])
                secs = time.perf_counter() - t0
            if kind == "FanoutCache(defaults)":
                kept = len(diskcache.FanoutCache(tmp))
            elif kind == "Cache(timeout=60)":
                kept = len(diskcache.Cache(tmp))
            else:
                kept = DiskCache(tmp).stats()["entries"]
            total = procs * count
            rows.append(
                {
                    "case": f"{kind}: {procs} procs x {count} sets",
                    "kept": kept,
                    "lost": total - kept,
                    "failed_calls": sum(f for f, _ in res),
                    "exceptions": sum(e for _, e in res),
                    "seconds": round(secs, 2),
                }
            )
    return rows


def print_rows(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n== {title}")
    cols = list(dict.fromkeys(k for r in rows for k in r))
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(cols, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--writes", type=int, default=1000)
    args = parser.parse_args()
    result = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "hash_value": bench_hash(args.quick),
        "store": bench_store(args.quick),
        "contention": bench_contention(args.procs, args.writes),
    }
    print_rows("hash_value (microseconds per call)", result["hash_value"])
    print_rows("DiskCache throughput (one process)", result["store"])
    print_rows("concurrent writers, one directory", result["contention"])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
