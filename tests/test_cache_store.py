"""Unit tests of the DiskCache store (hypernodes_dist.cache.disk) on real diskcache directories."""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import pickle
import warnings

import cloudpickle
import diskcache
import pytest

from hypernodes_dist.cache.disk import MISSING, DiskCache, decode, encode


def _files(path: pathlib.Path) -> list[pathlib.Path]:
    return [p for p in path.rglob("*.val")]


def test_round_trip_none_and_large(tmp_path: pathlib.Path) -> None:
    cache = DiskCache(tmp_path / "c")
    big = os.urandom(2 * 1024 * 1024)
    values = {"none": None, "int": 1, "dict": {"a": [1, 2.5, "x"]}, "big": big, "fn": lambda x: x}
    cache.set_many(values)
    got = cache.get_many(["none", "int", "dict", "big", "fn", "absent"])
    assert set(got) == {"none", "int", "dict", "big", "fn"}
    assert got["none"] is None and got["int"] == 1 and got["dict"] == values["dict"]
    assert got["big"] == big and got["fn"](5) == 5
    assert len(_files(tmp_path / "c")) == 1  # the large value is file-backed
    assert cache.get("absent") is MISSING
    assert cache.get("absent", 7) == 7 and cache.get("none", 7) is None
    assert "none" in cache and "absent" not in cache
    cache.set("k", [1])
    assert cache.get("k") == [1]
    cache.close()
    assert DiskCache(tmp_path / "c").get("big") == big  # reopens after close


def test_invalid_scope_names_allowed_scopes(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="global, session, run"):
        DiskCache(tmp_path, scope="forever")  # type: ignore[arg-type]


def test_entry_format_checks() -> None:
    blob = encode({"a": 1})
    assert decode(blob) == {"a": 1}
    flipped = blob[:-1] + bytes([blob[-1] ^ 1])
    bad = decode(flipped)
    assert bad is not None and bad != {"a": 1}
    for garbage in (b"", b"HNDC", blob[:10], b"x" * 40, 17, "text"):
        assert decode(garbage) == decode(b"")


def _raw(path: pathlib.Path) -> diskcache.Cache:
    return diskcache.Cache(str(path))


def test_corrupt_small_entries_are_misses_and_evicted(tmp_path: pathlib.Path) -> None:
    cache = DiskCache(tmp_path)
    cache.set_many({"checksum": "good", "garbage": "good", "foreign": "good", "unpickle": 1})
    raw = _raw(tmp_path)
    blob = raw.get("checksum")
    assert isinstance(blob, bytes)
    raw.set("checksum", blob[:-1] + bytes([blob[-1] ^ 0xFF]))  # payload no longer matches
    raw.set("garbage", b"\x00garbage")
    raw.set("foreign", 12345)  # not one of our entries at all
    # valid header and checksum, but the pickle refers to a module that does not exist
    payload = b"\x80\x05\x95\x0f\x00\x00\x00\x00\x00\x00\x00\x8c\x04nomod\x8c\x01X\x93\x94."
    good = encode(None)
    from xxhash import xxh3_128_digest

    raw.set("unpickle", good[:6] + xxh3_128_digest(payload) + payload)
    raw.close()
    assert cache.get_many(["checksum", "garbage", "foreign", "unpickle"]) == {}
    for key in ("checksum", "garbage", "foreign", "unpickle"):
        assert key not in cache
    cache.set("checksum", "fresh")
    assert cache.get("checksum") == "fresh"


def test_corrupt_file_backed_entries_are_misses_and_evicted(tmp_path: pathlib.Path) -> None:
    cache = DiskCache(tmp_path)
    cache.set("truncated", os.urandom(1 << 20))
    (file,) = _files(tmp_path)
    with open(file, "r+b") as f:
        f.truncate(1000)
    assert cache.get_many(["truncated"]) == {}
    assert "truncated" not in cache
    assert not file.exists()

    cache.set("deleted", b"y" * (1 << 20))
    (file,) = _files(tmp_path)
    file.unlink()
    assert "deleted" in cache  # the row is still there ...
    assert cache.get("deleted") is MISSING  # ... but it is a miss
    assert "deleted" not in cache


def test_pickle_round_trip_ships_no_connection(tmp_path: pathlib.Path) -> None:
    cache = DiskCache(tmp_path, scope="session", size_limit=2**30)
    cache.set("a", 1)
    assert cache.get("a") == 1  # connections are open now
    for dumps in (pickle.dumps, cloudpickle.dumps):
        data = dumps(cache)
        assert len(data) < 600
        clone = pickle.loads(data)
        assert (clone.path, clone.scope) == (cache.path, "session")
        assert clone.get("a") == 1
        clone.set("b", 2)
        assert cache.get("b") == 2


def _fork_child(cache: DiskCache, queue) -> None:
    cache.set("from-child", os.getpid())
    queue.put(cache.get("parent"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_reopens(tmp_path: pathlib.Path) -> None:
    cache = DiskCache(tmp_path)
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
    assert cache.get("from-child") == proc.pid
    assert cache.get("parent") == "p"


def _writer(path: str, worker: int, count: int) -> int:
    cache = DiskCache(path)
    for i in range(count):
        if i % 2:
            cache.set(f"w{worker}-{i}", {"worker": worker, "i": i})
        else:
            cache.set_many({f"w{worker}-{i}": {"worker": worker, "i": i}})
        cache.get_many([f"w{(worker + 1) % 8}-{i}"])
    return worker


@pytest.mark.slow
def test_many_processes_lose_no_writes(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "shared")
    ctx = multiprocessing.get_context("spawn")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a degraded cache would warn
        with ctx.Pool(8) as pool:
            done = pool.starmap(_writer, [(path, w, 1000) for w in range(8)])
    assert sorted(done) == list(range(8))
    keys = [f"w{w}-{i}" for w in range(8) for i in range(1000)]
    got = DiskCache(path).get_many(keys)
    assert len(got) == 8000
    assert got["w3-17"] == {"worker": 3, "i": 17}


def test_unopenable_directory_degrades_with_one_warning(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = DiskCache(blocker / "cache")  # fails even for root: the parent is a regular file
    with pytest.warns(RuntimeWarning, match="caching is disabled") as record:
        cache.set_many({"a": 1})
        cache.set("b", 2)
        assert cache.get_many(["a", "b"]) == {}
        assert cache.get("a", None) is None
        assert "a" not in cache
        assert cache.clear() == 0
        assert cache.stats()["enabled"] is False
    assert len([w for w in record if issubclass(w.category, RuntimeWarning)]) == 1


def test_not_a_database_degrades_with_one_warning(tmp_path: pathlib.Path) -> None:
    (tmp_path / "cache.db").write_bytes(b"this is not an sqlite database" * 100)
    cache = DiskCache(tmp_path)
    with pytest.warns(RuntimeWarning) as record:
        assert cache.get_many(["a"]) == {}
        cache.set_many({"a": 1})
        assert cache.get_many(["a"]) == {}
    assert len(record) == 1


def test_unpicklable_value_is_skipped_with_warning(tmp_path: pathlib.Path) -> None:
    import threading

    cache = DiskCache(tmp_path)
    with pytest.warns(RuntimeWarning, match="lock"):
        cache.set_many({"bad": threading.Lock(), "good": 1})
    assert cache.get_many(["bad", "good"]) == {"good": 1}


def test_clear_by_scope_and_stats(tmp_path: pathlib.Path) -> None:
    for scope, n in (("global", 3), ("session", 2), ("run", 1)):
        DiskCache(tmp_path, scope=scope).set_many({f"{scope}{i}": i for i in range(n)})
    cache = DiskCache(tmp_path)
    stats = cache.stats()
    assert stats["entries"] == 6 and stats["size_bytes"] > 0
    assert {k: v["entries"] for k, v in stats["by_scope"].items()} == {
        "global": 3,
        "session": 2,
        "run": 1,
    }
    assert cache.clear("run") == 1
    assert cache.get_many(["run0", "session0"]) == {"session0": 0}
    with pytest.raises(ValueError, match="allowed scopes"):
        cache.clear("nope")
    assert cache.clear() == 5
    assert cache.stats()["entries"] == 0


def test_failing_writes_degrade_to_read_only_with_one_warning(tmp_path: pathlib.Path) -> None:
    cache = DiskCache(tmp_path)
    cache.set("kept", 1)
    conn = cache._open()
    assert conn is not None
    conn._sql("PRAGMA query_only = 1")  # every write now fails inside SQLite, even for root
    with pytest.warns(RuntimeWarning, match="cannot write") as record:
        cache.set_many({"a": 1, "big": b"x" * (1 << 20)})
        cache.set("b", 2)
        assert cache.get_many(["kept", "a", "b"]) == {"kept": 1}  # reads keep working
    assert len(record) == 1
    assert cache.stats()["writable"] is False
