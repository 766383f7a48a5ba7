"""The writer processes of ``test_cache_machines.py``'s S3 tests, in a module of their own:
a ``spawn`` child imports the module of the function it runs, and the test module (Dask,
distributed, the conformance graphs) would cost each of the 12 children ~0.5 CPU s more."""

from __future__ import annotations

from hypernodes_dist.cache.objectstore import ObjectStoreCache


def s3_writer(url: str, worker: int, count: int) -> int:
    cache = ObjectStoreCache(url)
    for i in range(count):
        cache.set_many({f"w{worker}-{i}": {"worker": worker, "i": i}}, node=f"n{i % 3}")
    return worker


def s3_limited_writer(url: str, worker: int, batches: int, limit: int) -> int:
    cache = ObjectStoreCache(url, size_limit=limit)
    for b in range(batches):
        cache.set_many({f"w{worker}-{b}-{i}": f"{worker}-{b}-{i}:" + "v" * 2000
                        for i in range(5)}, node="n")
        cache.get_many([f"w{worker}-0-{i}" for i in range(5)], node="n")
    cache.close()
    return worker
