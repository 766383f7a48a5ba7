"""``size_limit`` and ``prune`` on both stores, on real directories and real processes.

"Another machine" is a process that shares only the store's directory with the others.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import pickle
import sqlite3
import time
import warnings

import pytest

from hypernodes_dist import DiskCache, ObjectStoreCache
from hypernodes_dist.cache.segments import pack
from hypernodes_dist.cache.store import Pruned
from hypernodes_dist.cache.units import parse_age, parse_size
from tests.fresh import FRESH

from .conformance.test_cache import Sampler, stored_bytes


def make(kind: str, path: pathlib.Path, **options):
    if kind == "disk":
        return DiskCache(path, **options)
    return ObjectStoreCache(str(path), **options)


@pytest.fixture(params=["disk", "objects"])
def kind(request) -> str:
    return request.param


def backend(kind: str):
    return DiskCache if kind == "disk" else ObjectStoreCache


def value(batch: int, i: int) -> bytes:
    return f"{batch:04d}-{i:04d}".encode() * 200  # 2 KB, distinct


def write_batch(cache, batch: int, n: int = 10) -> None:
    cache.set_many({f"b{batch}-{i}": value(batch, i) for i in range(n)}, node="n")


def read_batch(cache, batch: int, n: int = 10) -> dict:
    return cache.get_many([f"b{batch}-{i}" for i in range(n)], node="n")


def test_least_recently_used_segments_go_first(kind: str, tmp_path: pathlib.Path) -> None:
    limit = 100_000
    cache = make(kind, tmp_path / "c", size_limit=limit)
    for batch in range(60):  # ~20 KB per batch: the limit holds about four of them
        write_batch(cache, batch)
        if batch % 3 == 0:
            assert len(read_batch(cache, 0)) == 10  # batch 0 stays in use
            cache._touch_if_due(cache._open(), now=True)
    assert stored_bytes(backend(kind), tmp_path / "c") <= limit
    assert read_batch(cache, 0) == {f"b0-{i}": value(0, i) for i in range(10)}
    assert read_batch(cache, 59) == {f"b59-{i}": value(59, i) for i in range(10)}
    assert read_batch(cache, 30) == {}  # neither recent nor read: evicted
    stats = cache.stats()
    assert stats["size_limit"] == limit and 0 < stats["entries"] < 600
    cache.close()


def _writer(kind: str, path: str, me: int, batches: int, limit: int) -> None:
    cache = make(kind, pathlib.Path(path), size_limit=limit)
    for batch in range(batches):
        write_batch(cache, me * 1000 + batch)
        read_batch(cache, me * 1000)  # one batch each process keeps using
    cache.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_processes_writing_at_once_stay_under_the_limit(kind: str, tmp_path: pathlib.Path
                                                        ) -> None:
    """Four processes (sharing only the directory) write 40 batches each into a 160 KB
    cache: sampled all along, the store never holds more than the limit (plus, for the lock-free
    object store, one segment per other writer); every entry still there reads back right."""
    limit = 160_000
    path = tmp_path / "c"
    ctx = FRESH
    procs = [ctx.Process(target=_writer, args=(kind, str(path), me, 40, limit))
             for me in range(4)]
    with Sampler(backend(kind), path) as sampler:
        for p in procs:
            p.start()
        for p in procs:
            p.join(240)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    # DiskCache evicts in the insert's transaction; ObjectStoreCache has no lock across
    # processes: writers listing at one moment may each add one segment (README, Size limit)
    slack = 0 if kind == "disk" else 3 * limit // 8
    assert sampler.samples > 0 and 0 < sampler.peak <= limit + slack
    cache = make(kind, path)
    keys = {f"b{me * 1000 + b}-{i}": value(me * 1000 + b, i)
            for me in range(4) for b in range(40) for i in range(10)}
    found = cache.get_many(list(keys), node="n")
    assert 0 < len(found) < len(keys)
    assert all(found[k] == keys[k] for k in found)  # evicted = missing, never wrong


def test_prune_by_age_keeps_what_was_read(kind: str, tmp_path: pathlib.Path) -> None:
    cache = make(kind, tmp_path / "c", size_limit="10MB")
    write_batch(cache, 1)
    write_batch(cache, 2)
    time.sleep(1.3)
    assert len(read_batch(cache, 1)) == 10  # used now: recency renewed
    cache.close()  # records the use
    removed = make(kind, tmp_path / "c").prune(older_than="1s")
    assert removed == Pruned(1, 10, removed.nbytes) and removed.nbytes > 15_000
    again = make(kind, tmp_path / "c")
    assert len(read_batch(again, 1)) == 10 and read_batch(again, 2) == {}


def test_prune_to_a_size_removes_the_least_recently_used(kind: str, tmp_path: pathlib.Path
                                                         ) -> None:
    cache = make(kind, tmp_path / "c")
    for batch in range(5):
        write_batch(cache, batch)
        time.sleep(0.01)
    removed = cache.prune(max_size=50_000)  # room for two batches of ~20 KB
    assert removed.segments == 3 and removed.entries == 30
    assert [len(read_batch(cache, b)) for b in range(5)] == [0, 0, 0, 10, 10]
    assert cache.prune(max_size="1GB") == Pruned()


def test_a_result_larger_than_the_limit_is_skipped_not_fatal(kind: str, tmp_path: pathlib.Path
                                                             ) -> None:
    cache = make(kind, tmp_path / "c", size_limit=10_000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache.set_many({"big": b"x" * 50_000, "small": b"y"}, node="n")
    assert any("size_limit" in str(w.message) for w in caught)
    assert cache.get_many(["big", "small"], node="n") == {"small": b"y"}


def test_size_limit_values_and_errors(tmp_path: pathlib.Path) -> None:
    assert parse_size("10GB") == 10**10 and parse_size("2GiB") == 2 * 1024**3
    assert parse_size(" 1.5 mb ") == 1_500_000 and parse_size(4096) == 4096
    assert parse_size(None) is None
    assert parse_age("7d") == 7 * 86400 and parse_age("12h") == 43200 and parse_age(5) == 5.0
    for bad in ("ten", "10 parsecs", 0, -5, True):
        with pytest.raises(ValueError, match="size_limit"):
            DiskCache(tmp_path, size_limit=bad)
    with pytest.raises(ValueError, match="not an age"):
        DiskCache(tmp_path / "c").prune(older_than="soon")
    cache = ObjectStoreCache(str(tmp_path / "o"), size_limit="1MB")
    assert "size_limit=1000000" in repr(cache)
    assert pickle.loads(pickle.dumps(cache)).size_limit == 1_000_000
    assert pickle.loads(pickle.dumps(DiskCache(tmp_path, size_limit="1MB"))).size_limit == 10**6


def test_a_database_from_before_recency_is_upgraded(tmp_path: pathlib.Path) -> None:
    """A cache directory written before ``size_limit`` existed (no ``used`` column) opens,
    hits, counts its bytes toward the limit, and its entries count as just used."""
    path = tmp_path / "c"
    path.mkdir()
    con = sqlite3.connect(path / "hn-cache.db")
    con.execute("CREATE TABLE hn_segments(id INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT "
                "NULL, node TEXT NOT NULL, entries INTEGER NOT NULL, nbytes INTEGER NOT NULL, "
                "idx BLOB NOT NULL, data BLOB NOT NULL)")
    (packed,) = pack({"old": "value"})
    con.execute("INSERT INTO hn_segments(scope, node, entries, nbytes, idx, data) VALUES "
                "('global', 'n', 1, ?, ?, ?)", (packed.nbytes, packed.index, packed.data))
    con.commit()
    con.close()
    cache = DiskCache(path, size_limit="1MB")
    assert cache.get_many(["old"], node="n") == {"old": "value"}
    assert cache.prune(older_than="1h") == Pruned()
    assert stored_bytes(DiskCache, path) == packed.nbytes
    assert cache.prune(max_size=1) == Pruned(1, 1, packed.nbytes)


def page_size(path: pathlib.Path) -> int:
    con = sqlite3.connect(path / "hn-cache.db")
    try:
        return int(con.execute("PRAGMA page_size").fetchone()[0])
    finally:
        con.close()


def test_a_cache_with_64_kib_pages_keeps_working(tmp_path: pathlib.Path) -> None:
    """A cache directory made when new databases had 64 KiB pages keeps them, and is read,
    written (small, medium and file segments), evicted and pruned as before; a new cache
    gets 4 KiB pages."""
    path = tmp_path / "c"
    path.mkdir()
    con = sqlite3.connect(path / "hn-cache.db")
    for pragma in ("page_size=65536", "auto_vacuum=INCREMENTAL", "journal_mode=WAL"):
        con.execute(f"PRAGMA {pragma}")  # what DiskCache did to a new database then
    con.execute("CREATE TABLE hn_segments(id INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT "
                "NULL, node TEXT NOT NULL, entries INTEGER NOT NULL, nbytes INTEGER NOT NULL, "
                "idx BLOB NOT NULL, data BLOB NOT NULL, used REAL NOT NULL DEFAULT 0, file TEXT)")
    (packed,) = pack({"old": "value"})
    con.execute("INSERT INTO hn_segments(scope, node, entries, nbytes, idx, data, used) VALUES "
                "('global', 'n', 1, ?, ?, ?, ?)",
                (packed.nbytes, packed.index, packed.data, time.time()))
    con.commit()
    con.close()
    values = {"small": "x", "medium": os.urandom(30_000), "large": os.urandom(200_000)}
    writer = DiskCache(path, size_limit="2MB")
    for key, value in values.items():
        writer.set_many({key: value}, node="n")
    reader = DiskCache(path)
    assert reader.get_many(["old", *values], node="n") == {"old": "value", **values}
    for b in range(30):  # past the limit: the least recently used go first
        writer.set_many({f"more{b}": os.urandom(100_000)}, node="n")
    assert stored_bytes(DiskCache, path) <= 2_000_000
    assert writer.get_many(["old"], node="n") == {}
    assert writer.prune(max_size=1).segments > 0
    assert writer.stats()["entries"] == 0
    writer.set_many({"again": "y"}, node="n")
    assert DiskCache(path).get_many(["again"], node="n") == {"again": "y"}
    assert page_size(path) == 65536
    DiskCache(tmp_path / "new").set_many({"k": 1})
    assert page_size(tmp_path / "new") == 4096


def test_object_store_use_logs_stay_few(tmp_path: pathlib.Path) -> None:
    """Every reading process writes a small log of what it used; eviction and pruning merge
    them, so a long run leaves a handful, not thousands."""
    cache = ObjectStoreCache(str(tmp_path / "o"), size_limit=60_000)
    store = cache._open()
    for batch in range(40):
        write_batch(cache, batch)
        read_batch(cache, batch)
        store.touch(list(cache._touched) or ["x"])
    logs = list((tmp_path / "o").rglob("used/*.log"))
    assert len(logs) <= 10
    cache.prune(max_size="1GB")
    assert len(list((tmp_path / "o").rglob("used/*.log"))) <= 1
    assert stored_bytes(ObjectStoreCache, tmp_path / "o") <= 60_000


def test_forked_writers_share_the_limit(kind: str, tmp_path: pathlib.Path) -> None:
    """A cache handed to forked children (the pattern of a process pool) limits them too."""
    if not hasattr(os, "fork"):
        pytest.skip("fork")
    limit = 80_000
    cache = make(kind, tmp_path / "c", size_limit=limit)
    write_batch(cache, 0)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=lambda me=me: [write_batch(cache, me * 100 + b)
                                              for b in range(15)]) for me in range(1, 3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert stored_bytes(backend(kind), tmp_path / "c") <= limit


def test_large_segments_are_files_that_go_with_their_rows(tmp_path: pathlib.Path) -> None:
    """A DiskCache keeps segments of 64 KiB or more in files: eviction and pruning delete
    them, a file gone under a reader is a miss, a file no row names (a writer killed between
    file and row) is removed by prune once an hour old."""
    path = tmp_path / "c"
    cache = DiskCache(path, size_limit=400_000)
    blobs = {f"k{b}": os.urandom(100_000) for b in range(20)}
    for key, blob in blobs.items():
        cache.set_many({key: blob}, node="n")
    files = sorted((path / "segments").glob("*.seg"))
    assert 0 < len(files) <= 4 and stored_bytes(DiskCache, path) <= 400_000
    found = cache.get_many(list(blobs), node="n")
    assert found and all(found[k] == blobs[k] for k in found) and "k19" in found
    for f in files:
        f.unlink()  # what another process's eviction does
    assert DiskCache(path).get_many(list(blobs), node="n") == {}
    orphan = path / "segments" / "0123.seg"
    orphan.write_bytes(b"half a segment")
    young = path / "segments" / "4567.seg"
    young.write_bytes(b"being written")
    os.utime(orphan, (time.time() - 7200, time.time() - 7200))
    DiskCache(path).prune(max_size=1)
    assert sorted(p.name for p in (path / "segments").iterdir()) == ["4567.seg"]
