"""The shared cache under faults, end to end through ``Graph.map``.

- a writer process SIGKILLed mid-map (mid-write) leaves no entry that reads back wrong: a
  later map over the same items returns exactly the right values;
- truncated and garbage segments (small and large), are misses: recomputed, correct, and
  healed (the next map hits);
- a cache that cannot be used — directory under a regular file, ``hn-cache.db`` replaced by a
  directory, an immutable (``chattr +i``) directory, a file-size limit that makes every
  write fail like a full disk — degrades to no caching with exactly ONE ``RuntimeWarning``;
  the map completes with correct results. (Tests run as root: ``chmod`` would not stop
  them, each of these fails for root too.)

Writes lost under concurrency: ``test_concurrent_writers.py``. Trust model: ``test_trust_model.py``.
"""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.engines import DaskEngine

from . import graphs as R

ROOT = Path(__file__).resolve().parents[2]
BIG = 64 * 1024  # >= 32 KiB: file-backed entries


def expected_blob(x: int, size: int) -> bytes:
    return R.make_blob.func(x, size)  # the plain function: the oracle


class Calls:
    """Callback counting executed (not cached) runs and hits per node."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, int]] = []
        self.hit: list[tuple[str, int]] = []

    def on_node_end(self, event) -> None:
        (self.hit if event.cached else self.ran).append((event.node_id, event.item_index))


# --------------------------------------------------------------------------- killed writer

WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from hypernodes_dist import DiskCache, Graph, GraphEngine
    from tests.reliability import graphs as R

    path, start = sys.argv[1], int(sys.argv[2])
    g = Graph([R.make_blob, R.blob_len], engine=GraphEngine(batch_size=8),
              cache=DiskCache(path))
    print("ready", flush=True)
    while True:  # keep writing until killed: small and file-backed entries interleaved
        for size in (64, {big}):
            g.map({{"x": list(range(start, start + 400)), "size": size}}, map_over="x")
        start += 400
""")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_writer_killed_mid_write_leaves_nothing_that_reads_back_wrong(tmp_path):
    path = tmp_path / "cache"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=str(ROOT), big=BIG))
    kills = 0
    for round_ in range(4):
        proc = subprocess.Popen([sys.executable, str(script), str(path), str(round_ * 100_000)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdout.readline().strip() == b"ready", proc.stderr.read()
            time.sleep(0.4 + 0.3 * round_)  # mid-map, mid-transaction, mid-file-write
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(30) == -signal.SIGKILL
            kills += 1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # Every entry that exists must read back right: map over everything the writers could
    # have written; hits and recomputations alike must equal the oracle.
    cache = DiskCache(path)
    stored = cache.stats()["entries"]
    assert stored > 0, "the writers never reached the cache"
    calls = Calls()
    g = Graph([R.make_blob, R.blob_len], cache=cache, callbacks=[calls])
    hits = 0
    for round_ in range(4):
        base = round_ * 100_000
        xs = list(range(base, base + 800))
        for size in (64, BIG):
            res = g.map({"x": xs, "size": size}, map_over="x")
            assert [r["blob"] for r in res] == [expected_blob(x, size) for x in xs]
            assert [r["length"] for r in res] == [size] * len(xs)
    hits = len(calls.hit)
    assert hits > 0  # the killed writers' finished work was kept and reused
    KILLED_WRITERS.append(kills)


KILLED_WRITERS: list[int] = []


# --------------------------------------------------------------------------- corrupt entries


def _segments(path: Path) -> list[tuple[int, int]]:
    """``(id, bytes of data)`` of every segment (in the database or in its own file)."""
    con = sqlite3.connect(path / "hn-cache.db")
    try:
        return con.execute("SELECT id, nbytes - length(idx) FROM hn_segments ORDER BY id"
                           ).fetchall()
    finally:
        con.close()


def _damage(path: Path, ref: int, how) -> None:
    """Rewrite one segment's stored data with ``how(bytes) -> bytes``, where it lives: the
    row's blob, or the segment's file (large segments)."""
    con = sqlite3.connect(path / "hn-cache.db")
    with con:
        data, file = con.execute("SELECT data, file FROM hn_segments WHERE id = ?",
                                 (ref,)).fetchone()
        if file:
            target = path / "segments" / file
            target.write_bytes(how(target.read_bytes()))
        else:
            con.execute("UPDATE hn_segments SET data = ? WHERE id = ?", (how(data), ref))
    con.close()


@pytest.mark.parametrize("engine", ["local", "dask-sync"])
def test_truncated_and_garbage_entries_are_recomputed(tmp_path, engine):
    path = tmp_path / "cache"
    xs = list(range(12))
    make = (lambda: None) if engine == "local" else (lambda: DaskEngine(scheduler="sync"))
    for size in (64, BIG):
        for x in xs:  # one map per item: one segment per entry
            Graph([R.make_blob], cache=DiskCache(path), engine=make()).map(
                {"x": [x], "size": size}, map_over="x")
    segments = _segments(path)
    small = [i for i, n in segments if n < BIG]
    large = [i for i, n in segments if n >= BIG]
    assert len(small) == len(large) == len(xs)

    for ids in (small, large):  # truncated, garbage, a flipped last byte, emptied: both sizes
        _damage(path, ids[0], lambda data: data[:10])
        _damage(path, ids[1], lambda data: b"\x00garbage" * 9)
        _damage(path, ids[2], lambda data: data[:-1] + b"\xff")
        _damage(path, ids[3], lambda data: b"")

    for size, bad in ((64, 4), (BIG, 4)):
        calls = Calls()
        g = Graph([R.make_blob], cache=DiskCache(path), engine=make(), callbacks=[calls])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a corrupt entry is a quiet miss, not a warning
            res = g.map({"x": xs, "size": size}, map_over="x")
        assert [r["blob"] for r in res] == [expected_blob(x, size) for x in xs]
        assert len(calls.ran) == bad and len(calls.hit) == len(xs) - bad
    # healed: everything hits now
    calls = Calls()
    g = Graph([R.make_blob], cache=DiskCache(path), callbacks=[calls])
    for size in (64, BIG):
        g.map({"x": xs, "size": size}, map_over="x")
    assert calls.ran == [] and len(calls.hit) == 2 * len(xs)


# --------------------------------------------------------------------------- degraded cache


def _map_with_one_warning(path: Path, engine=None) -> None:
    xs = list(range(40))
    g = Graph([R.slow_inc, R.slow_square], cache=DiskCache(path), engine=engine)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):  # a second map on the same cache instance: still one warning
            res = g.map({"x": xs, "delay": 0.0}, map_over="x")
            assert [r["z"] for r in res] == [(x + 1) ** 2 for x in xs]
            assert all(r.status == "complete" for r in res)
    cache_warnings = [w for w in record if issubclass(w.category, RuntimeWarning)]
    assert len(cache_warnings) == 1, [str(w.message) for w in record]
    assert "caching is disabled" in str(cache_warnings[0].message)


@pytest.mark.parametrize("engine", [None, "dask-sync"])
def test_cache_dir_under_a_regular_file_degrades(tmp_path, engine):
    blocker = tmp_path / "file"
    blocker.write_text("a regular file")
    _map_with_one_warning(blocker / "cache",
                          DaskEngine(scheduler="sync") if engine else None)


@pytest.mark.parametrize("engine", [None, "dask-sync"])
def test_database_replaced_by_a_directory_degrades(tmp_path, engine):
    path = tmp_path / "cache"
    DiskCache(path).set("warm", 1)
    warm = DiskCache(path)
    warm.close()
    (path / "hn-cache.db").unlink()
    for extra in ("hn-cache.db-wal", "hn-cache.db-shm"):
        if (path / extra).exists():
            (path / extra).unlink()
    (path / "hn-cache.db").mkdir()
    _map_with_one_warning(path, DaskEngine(scheduler="sync") if engine else None)


def _chattr(flag: str, *paths: Path) -> bool:
    if shutil.which("chattr") is None:
        return False
    done = subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True)
    return done.returncode == 0


def test_immutable_cache_directory_degrades(tmp_path):
    """A read-only cache for root too: ``chattr +i`` (no file can be created or changed)."""
    path = tmp_path / "cache"
    warm = DiskCache(path)
    warm.set("warm", 1)
    warm.close()
    probe = tmp_path / "probe"
    probe.mkdir()
    if not _chattr("+i", probe):
        pytest.skip("chattr +i is not permitted here")
    _chattr("-i", probe)
    members = sorted(path.rglob("*"))
    assert _chattr("+i", path, *members)
    try:
        _map_with_one_warning(path)
    finally:
        _chattr("-i", path, *members)


FULL_DISK = textwrap.dedent("""
    import json, resource, signal, sys, warnings
    sys.path.insert(0, {root!r})
    from hypernodes_dist import DiskCache, Graph
    from tests.reliability import graphs as R

    path = sys.argv[1]
    cache = DiskCache(path)
    cache.set("warm", 1)   # the database exists and opens
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    limit = 16 * 1024  # smaller than one file-backed entry: every file write fails
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    g = Graph([R.make_blob, R.blob_len], cache=cache)
    xs = list(range(30))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        res = g.map({{"x": xs, "size": 64 * 1024}}, map_over="x")
        res2 = g.map({{"x": xs, "size": 64 * 1024}}, map_over="x")
    print(json.dumps({{
        "ok": [r["length"] for r in res] == [64 * 1024] * 30
              and [r["blob"] for r in res2] == [R.make_blob.func(x, 64 * 1024) for x in xs],
        "warnings": [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)],
    }}))
""")


def test_full_disk_degrades_to_no_caching(tmp_path):
    """RLIMIT_FSIZE binds root as well: every write that grows a file fails like ENOSPC."""
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK.format(root=str(ROOT)))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"]
    assert len(report["warnings"]) == 1, report["warnings"]
    assert "cannot write" in report["warnings"][0]
