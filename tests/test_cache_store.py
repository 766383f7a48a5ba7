"""The two cache stores on real directories: DiskCache (SQLite) and ObjectStoreCache (files).

Every test runs on both backends through the ``Cache`` protocol; corruption is done the way a
disk or a crashed writer would do it, on the stored bytes themselves.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import pickle
import sqlite3
import threading
import warnings

import cloudpickle
import pytest

from hypernodes_dist import DiskCache, ObjectStoreCache
from hypernodes_dist.cache import MISSING, Cache
from hypernodes_dist.cache.segments import decode_block, decode_index, pack
from tests.fresh import FRESH

BACKENDS = ["disk", "objects"]


def make(kind: str, path: pathlib.Path, scope: str = "global"):
    if kind == "disk":
        return DiskCache(path, scope=scope)
    return ObjectStoreCache(str(path), scope=scope)


@pytest.fixture(params=BACKENDS)
def kind(request) -> str:
    return request.param


def segments(kind: str, path: pathlib.Path) -> list:
    """The stored segments: SQLite row ids or ``.seg`` files."""
    if kind == "disk":
        con = sqlite3.connect(path / "hn-cache.db")
        try:
            return [i for (i,) in con.execute("SELECT id FROM hn_segments ORDER BY id")]
        finally:
            con.close()
    return sorted(path.rglob("*.seg"))


def damage(kind: str, path: pathlib.Path, how) -> None:
    """Rewrite every segment's data with ``how(bytes) -> bytes``."""
    if kind == "disk":
        con = sqlite3.connect(path / "hn-cache.db")
        for (i, data) in con.execute("SELECT id, data FROM hn_segments").fetchall():
            con.execute("UPDATE hn_segments SET data = ? WHERE id = ?", (how(data), i))
        con.commit()
        con.close()
    else:
        for seg in path.rglob("*.seg"):
            seg.write_bytes(how(seg.read_bytes()))


def test_round_trip_none_functions_and_large(kind: str, tmp_path: pathlib.Path) -> None:
    cache = make(kind, tmp_path / "c")
    assert isinstance(cache, Cache)
    big = os.urandom(3 * 1024 * 1024)
    values = {"none": None, "int": 1, "dict": {"a": [1, 2.5, "x"]}, "big": big, "fn": lambda x: x}
    cache.set_many(values, node="n")
    got = make(kind, tmp_path / "c").get_many(["none", "int", "dict", "big", "fn", "absent"])
    assert set(got) == {"none", "int", "dict", "big", "fn"}
    assert got["none"] is None and got["int"] == 1 and got["dict"] == values["dict"]
    assert got["big"] == big and got["fn"](5) == 5
    assert cache.get("absent") is MISSING and cache.get("absent", 7) == 7
    assert cache.get("none", 7) is None
    assert "none" in cache and "absent" not in cache


def test_one_missing_that_pickles_to_itself() -> None:
    """The cache's miss marker is the executor's absent value: one object, falsy, which
    comes back as itself from pickle and cloudpickle (a worker process's result keeps it)."""
    from hypernodes_dist.missing import MISSING as ONE

    assert MISSING is ONE and not MISSING and repr(MISSING) == "MISSING"
    assert pickle.loads(pickle.dumps(MISSING)) is MISSING
    assert cloudpickle.loads(cloudpickle.dumps([MISSING]))[0] is MISSING


def test_many_values_in_blocks_and_partial_reads(kind: str, tmp_path: pathlib.Path) -> None:
    cache = make(kind, tmp_path / "c")
    items = {f"k{i}": (i, "v" * (i % 7)) for i in range(20_000)}
    cache.set_many(items, node="n")
    other = make(kind, tmp_path / "c")
    assert other.get_many([f"k{i}" for i in range(0, 20_000, 997)], node="n") == {
        f"k{i}": items[f"k{i}"] for i in range(0, 20_000, 997)}
    assert other.get_many(list(items), node="n") == items
    assert other.get("k12345") == items["k12345"]


def test_pack_format_checks() -> None:
    (seg,) = pack({"a": 1, "b\nweird key": [2]})
    keys, rows = decode_index(seg.index)
    assert keys == ["a", "b\nweird key"] and rows[0][2] == 2
    off, length, count = rows[0]
    assert decode_block(seg.data[off:off + length], count) == [1, [2]]
    flipped = seg.data[:-1] + bytes([seg.data[-1] ^ 1])
    for bad in (flipped, seg.data[:10], b"", b"x" * 100, None):
        assert decode_block(bad, count) is None
    for bad in (seg.index[:-3], b"HNX1" + b"\0" * 40, b"", 17):
        assert decode_index(bad) is None


def test_handle_pickles_its_configuration_only(kind: str, tmp_path: pathlib.Path) -> None:
    cache = make(kind, tmp_path / "c", scope="session")
    cache.set("a", 1)
    assert cache.get("a") == 1  # connections are open now
    for dumps in (pickle.dumps, cloudpickle.dumps):
        data = dumps(cache)
        assert len(data) < 700
        clone = pickle.loads(data)
        assert clone.scope == "session" and clone.get("a") == 1
        clone.set("b", 2)
        assert cache.get("b") == 2


def _fork_child(cache, queue) -> None:
    cache.set("from-child", os.getpid())
    queue.put(cache.get("parent"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_reopens(kind: str, tmp_path: pathlib.Path) -> None:
    cache = make(kind, tmp_path / "c")
    cache.set("parent", "p")
    assert cache.get("parent") == "p"
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_fork_child, args=(cache, queue))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, py3.12+
        proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert queue.get(timeout=5) == "p"
    assert cache.get("from-child") == proc.pid and cache.get("parent") == "p"


def _writer(kind: str, path: str, worker: int, count: int) -> int:
    cache = make(kind, pathlib.Path(path))
    for i in range(count):
        if i % 2:
            cache.set(f"w{worker}-{i}", {"worker": worker, "i": i}, node=f"n{i % 3}")
        else:
            cache.set_many({f"w{worker}-{i}": {"worker": worker, "i": i}}, node=f"n{i % 3}")
        if i % 250 == 0:
            cache.get_many([f"w{(worker + 1) % 8}-{i}"])
    return worker


def _opener(path: str, barrier: threading.Barrier, worker: int) -> str:
    """Open a new ``DiskCache`` at the same moment as the other workers, then write."""
    barrier.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a cache that could not open warns
        DiskCache(path).set_many({f"w{worker}": worker}, node="n")
    return "ok"


@pytest.mark.slow
def test_many_processes_opening_a_new_disk_cache_at_once_all_open_it(tmp_path: pathlib.Path
                                                                     ) -> None:
    """Creating the database, its WAL mode and its schema from 12 processes at once: none
    may give up with "database is locked" (SQLite's busy timeout does not cover them all)."""
    ctx = FRESH
    with ctx.Manager() as manager, ctx.Pool(12) as pool:
        for trial in range(3):
            path = str(tmp_path / f"c{trial}")
            barrier = manager.Barrier(12)
            assert pool.starmap(_opener, [(path, barrier, w) for w in range(12)]) == ["ok"] * 12
            assert len(DiskCache(path).get_many([f"w{w}" for w in range(12)])) == 12


@pytest.mark.slow
def test_eight_processes_times_1000_writes_lose_nothing(kind: str, tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "shared")
    ctx = FRESH
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a degraded cache would warn
        with ctx.Pool(8) as pool:
            done = pool.starmap(_writer, [(kind, path, w, 1000) for w in range(8)])
    assert sorted(done) == list(range(8))
    keys = [f"w{w}-{i}" for w in range(8) for i in range(1000)]
    fresh = make(kind, pathlib.Path(path))
    got = fresh.get_many(keys)
    assert len(got) == 8000
    assert got["w3-17"] == {"worker": 3, "i": 17}
    assert fresh.stats()["entries"] == 8000


@pytest.mark.parametrize("how", [
    lambda b: b[: len(b) // 2],  # truncated
    lambda b: b"\x00garbage" * 10,  # garbage
    lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]),  # one flipped bit: checksum
    lambda b: b"",  # empty
], ids=["truncated", "garbage", "flipped", "empty"])
def test_corrupt_segments_are_misses_and_evicted(kind: str, tmp_path: pathlib.Path, how) -> None:
    path = tmp_path / "c"
    make(kind, path).set_many({"a": "good", "b": list(range(100))}, node="n")
    damage(kind, path, how)
    reader = make(kind, path)
    assert reader.get_many(["a", "b"], node="n") == {}
    assert segments(kind, path) == []  # evicted
    reader.set_many({"a": "fresh"}, node="n")
    assert make(kind, path).get_many(["a", "b"]) == {"a": "fresh"}


def test_corrupt_index_object_is_a_miss(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c"
    make("objects", path).set_many({"a": 1}, node="n")
    (idx,) = path.rglob("*.idx")
    idx.write_bytes(idx.read_bytes()[:20])
    assert make("objects", path).get_many(["a"]) == {}
    assert list(path.rglob("*.idx")) == []
    # an index whose segment never arrived is ignored, not trusted
    make("objects", path).set_many({"b": 2}, node="n")
    for seg in path.rglob("*.seg"):
        seg.unlink()
    assert make("objects", path).get_many(["b"]) == {}


def test_unpickling_failure_is_a_miss(kind: str, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c"
    cache = make(kind, path)

    class Gone:
        pass

    Gone.__module__ = "module_that_does_not_exist"
    Gone.__qualname__ = "Gone"
    import sys

    sys.modules["module_that_does_not_exist"] = type(sys)("module_that_does_not_exist")
    sys.modules["module_that_does_not_exist"].Gone = Gone
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cache.set_many({"g": Gone()}, node="n")
    del sys.modules["module_that_does_not_exist"]
    assert make(kind, path).get_many(["g"]) == {}


def test_unopenable_store_degrades_with_one_warning(kind: str, tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = make(kind, blocker / "cache")  # fails even for root: the parent is a regular file
    with pytest.warns(RuntimeWarning, match="disabled") as record:
        cache.set_many({"a": 1})
        cache.set("b", 2)
        assert cache.get_many(["a", "b"]) == {}
        assert cache.get("a", None) is None
        assert "a" not in cache
    assert len([w for w in record if issubclass(w.category, RuntimeWarning)]) == 1


def test_not_a_database_degrades_with_one_warning(tmp_path: pathlib.Path) -> None:
    (tmp_path / "hn-cache.db").write_bytes(b"this is not an sqlite database" * 100)
    cache = DiskCache(tmp_path)
    with pytest.warns(RuntimeWarning) as record:
        assert cache.get_many(["a"]) == {}
        cache.set_many({"a": 1})
        assert cache.get_many(["a"]) == {}
        assert cache.clear() == 0 and cache.stats()["enabled"] is False
    assert len(record) == 1


def test_failing_writes_degrade_to_read_only_with_one_warning(kind: str, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c"
    cache = make(kind, path)
    cache.set("kept", 1, node="n")
    if kind == "disk":
        cache._open()._connect().execute("PRAGMA query_only = 1")  # every write now fails
    else:  # a regular file where the node's directory would go: every write fails, even for root
        (path / "hncache-v1" / "global" / "m").write_text("in the way")
    with pytest.warns(RuntimeWarning, match="cannot write") as record:
        cache.set_many({"a": 1, "big": b"x" * (1 << 20)}, node="m")
        cache.set("b", 2, node="m")
        assert cache.get_many(["kept", "a", "b"]) == {"kept": 1}  # reads keep working
    assert len(record) == 1
    assert cache.stats()["writable"] is False


def test_unpicklable_value_is_skipped_with_warning(kind: str, tmp_path: pathlib.Path) -> None:
    cache = make(kind, tmp_path / "c")
    with pytest.warns(RuntimeWarning, match="lock"):
        cache.set_many({"bad": threading.Lock(), "good": 1})
    assert cache.get_many(["bad", "good"]) == {"good": 1}


def test_clear_by_scope_and_node_and_stats(kind: str, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c"
    for scope, n in (("global", 3), ("session", 2), ("run", 1)):
        make(kind, path, scope).set_many({f"{scope}{i}": i for i in range(n)}, node="a")
    make(kind, path).set_many({"b0": "x" * 1000, "b1": "y"}, node="b")
    cache = make(kind, path)
    stats = cache.stats()
    assert stats["entries"] == 8 and stats["size_bytes"] > 1000
    assert {k: v["entries"] for k, v in stats["by_scope"].items()} == {
        "global": 5, "session": 2, "run": 1}
    assert {k: v["entries"] for k, v in stats["by_node"].items()} == {"a": 6, "b": 2}
    assert stats["by_node"]["b"]["bytes"] > 1000
    assert cache.clear(node="b") == 2
    assert cache.get_many(["b0", "global0"]) == {"global0": 0}
    assert cache.clear("run") == 1
    assert make(kind, path, "session").get_many(["run0", "session0"]) == {"session0": 0}
    with pytest.raises(ValueError, match="allowed scopes"):
        cache.clear("nope")
    assert cache.clear() == 5
    assert cache.stats()["entries"] == 0


def test_a_segment_over_the_store_limit_is_skipped_not_fatal(tmp_path: pathlib.Path) -> None:
    cache = DiskCache(tmp_path / "c")
    store = cache._open()
    store.max_segment_bytes = 1000  # stands in for SQLite's 1 GB blob limit
    with pytest.warns(RuntimeWarning, match="not cached"):
        cache.set_many({"huge": b"x" * 5000}, node="n")
    cache.set_many({"small": 1}, node="n")  # writing is still on
    assert cache.get_many(["huge", "small"]) == {"small": 1}
    assert cache.stats()["writable"] is True
