"""Dask workers killed with SIGKILL, on a real ``dask scheduler`` + ``dask worker`` cluster.

``tests/dask/test_fault.py`` already kills one of two nanny-less workers once mid-map. This
file extends it to what production clusters see:

- workers under nannies (restarted after a kill) killed *repeatedly* during one map of a
  two-node, cached graph: every result correct and in item order, every item in the cache;
- a node that SIGKILLs its own worker process on one item (a segfault / OOM kill in
  practice): the map ends, within seconds, in a ``NodeError`` naming the nodes and the item
  (the scheduler's ``KilledWorker`` after ``allowed_failures`` deaths), never a hang, and
  the cluster is usable afterwards;
- the same poison node on ``scheduler="processes"``: a ``NodeError`` naming the items in
  flight instead of a bare ``BrokenProcessPool``; the pool is rebuilt for the next map.

``KILLS`` counts the worker kills the suite survived (printed at the end: ``figures.py``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.engines import DaskEngine
from hypernodes_dist.errors import NodeError

from . import graphs as R

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")

KILLS: list[str] = []  # one entry per worker process killed and survived


def _worker_pids(client) -> dict[str, int]:
    """Pids of the live worker processes (a worker dying meanwhile is skipped)."""
    return client.run(os.getpid, on_error="ignore")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_repeated_worker_kills_mid_map_lose_nothing(start_cluster, tmp_path):
    cluster = start_cluster(workers=3, nanny=True, allowed_failures=10)
    engine = DaskEngine(address=cluster.address, partition_size=3)
    cache = DiskCache(tmp_path / "cache")
    try:
        client = engine.client
        client.wait_for_workers(3, timeout=60)
        xs = list(range(120))
        done: list[int] = []
        killed: list[int] = []
        stop = threading.Event()

        def killer() -> None:
            """Kill a (live) worker process each time another quarter of the items is in."""
            marks = [len(xs) // 6, len(xs) // 3, len(xs) // 2]
            while marks and not stop.is_set():
                if len(done) >= marks[0]:
                    marks.pop(0)
                    try:
                        pids = [p for p in _worker_pids(client).values() if p not in killed]
                    except Exception:  # noqa: BLE001 - a worker just died: ask again
                        marks.insert(0, 0)
                        continue
                    if pids:
                        os.kill(pids[0], signal.SIGKILL)
                        killed.append(pids[0])
                time.sleep(0.01)

        class Count:
            def on_node_end(self, event):
                if event.node_id == "slow_square":
                    done.append(event.item_index)

        g = Graph([R.slow_inc, R.slow_square], engine=engine, cache=cache, callbacks=[Count()])
        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            res = g.map({"x": xs, "delay": 0.03}, map_over="x")
        finally:
            stop.set()
            thread.join(10)
        assert len(killed) == 3, f"only {len(killed)} kills happened before the map ended"
        assert [r["z"] for r in res] == [(x + 1) ** 2 for x in xs]
        assert [r["y"] for r in res] == [x + 1 for x in xs]
        assert all(r.status == "complete" for r in res)
        assert sorted(done) == xs  # every item reported once, none twice
        # every item reached the shared cache despite the kills: a warm map is all hits
        hits: list[bool] = []

        class Hits:
            def on_node_end(self, event):
                hits.append(event.cached)

        warm = Graph([R.slow_inc, R.slow_square], cache=cache, callbacks=[Hits()])
        assert [r["z"] for r in warm.map({"x": xs, "delay": 0.03}, map_over="x")] == [
            (x + 1) ** 2 for x in xs]
        assert hits and all(hits) and len(hits) == 2 * len(xs)
        KILLS.extend(f"distributed:{p}" for p in killed)
    finally:
        engine.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_node_killing_its_worker_every_time_is_a_clear_error_not_a_hang(start_cluster):
    cluster = start_cluster(workers=2, nanny=True, allowed_failures=1)
    # One partition per worker (2 x 4 items): no innocent partition waits on a worker the
    # poison kills, so the KilledWorker that surfaces is the poison partition's.
    engine = DaskEngine(address=cluster.address, partition_size=4)
    try:
        client = engine.client
        client.wait_for_workers(2, timeout=60)
        before = set(_worker_pids(client).values())
        g = Graph([R.prepare, R.kill_after_prepare], engine=engine)
        t0 = time.monotonic()
        with pytest.raises(NodeError) as info:
            g.map({"x": list(range(8))}, map_over="x")  # item 3: prep == 30 kills the worker
        elapsed = time.monotonic() - t0
        err = info.value
        text = str(err) + " ".join(getattr(err, "__notes__", []))
        assert "items 0..3" in text  # the partition holding item 3 (partition_size=4)
        assert "kill_after_prepare" in text and "prepare" in text
        assert 3 in err.hn_items
        assert type(err.__cause__).__name__ == "KilledWorker"
        assert elapsed < 60, f"took {elapsed:.0f}s to fail"

        # one item, one partition: the error names the exact node and item
        single = Graph([R.kill_my_worker], engine=DaskEngine(client=client, partition_size=1))
        client.wait_for_workers(2, timeout=60)
        with pytest.raises(NodeError, match=r"item 0 \(in node 'kill_my_worker'\)") as info:
            single.map({"x": [3]}, map_over="x")
        assert (info.value.hn_node, info.value.hn_item) == ("kill_my_worker", 0)

        # the nannies restarted the workers: the cluster still serves maps
        client.wait_for_workers(2, timeout=60)
        res = g.map({"x": list(range(8)), "poison": -1}, map_over="x")
        assert [r["boom"] for r in res] == [10 * x + 1 for x in range(8)]
        after = set(_worker_pids(client).values())
        lost = before - after
        assert len(lost) >= 2  # at least allowed_failures + 1 worker processes died
        KILLS.extend(f"poison:{p}" for p in lost)  # worker processes the poison node killed
    finally:
        engine.close()


@pytest.mark.timeout(120)
def test_process_pool_worker_death_names_the_items_and_recovers():
    engine = DaskEngine(scheduler="processes", num_workers=2, partition_size=2)
    try:
        g = Graph([R.prepare, R.kill_after_prepare], engine=engine)
        with pytest.raises(NodeError) as info:
            g.map({"x": list(range(8))}, map_over="x")
        err = info.value
        assert "items 2..3" in str(err) and "kill_after_prepare" in str(err)
        assert 3 in err.hn_items
        assert type(err.__cause__).__name__ == "BrokenProcessPool"
        KILLS.append("processes")
        res = g.map({"x": list(range(8)), "poison": -1}, map_over="x")  # a fresh pool
        assert [r["boom"] for r in res] == [10 * x + 1 for x in range(8)]
    finally:
        engine.close()
