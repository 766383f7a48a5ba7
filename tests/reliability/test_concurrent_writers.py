"""8 processes and a Dask LocalCluster writing one cache directory at the same moment.

Each of 8 spawned processes maps its own items through a two-node cached graph (local
engine, small batches: many write transactions) while the driver maps another range on a
2-worker ``LocalCluster`` into the same directory. Every process runs with
``-W error::RuntimeWarning`` (a degraded cache — e.g. after "database is locked" — warns, so
it would fail the process) and its stderr is searched for "database is locked".

Then: 0 lost writes — every entry is in the directory, and a warm map over all items
hits every node of every item (nothing recomputed).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.engines import DaskEngine

from . import graphs as R

ROOT = Path(__file__).resolve().parents[2]
PROCESSES, ITEMS = 8, 600

WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from hypernodes_dist import DiskCache, Graph, GraphEngine
    from tests.reliability import graphs as R

    path, start, n, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    g = Graph([R.slow_inc, R.slow_square], engine=GraphEngine(batch_size=25),
              cache=DiskCache(path))
    while time.time() < go:  # start together
        time.sleep(0.005)
    xs = list(range(start, start + n))
    res = g.map({{"x": xs, "delay": 0.0}}, map_over="x")
    assert [r["z"] for r in res] == [(x + 1) ** 2 for x in xs]
    print("done", flush=True)
""")

LOST: list[int] = []


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_eight_processes_and_a_local_cluster_lose_no_writes(tmp_path):
    from distributed import Client, LocalCluster

    path = tmp_path / "shared-cache"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=str(ROOT)))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0", silence_logs=logging.WARNING) as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=60)
        go = time.time() + 4.0
        procs = [
            subprocess.Popen(
                [sys.executable, "-W", "error::RuntimeWarning", str(script), str(path),
                 str(w * ITEMS), str(ITEMS), str(go)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for w in range(PROCESSES)
        ]
        try:
            xs = list(range(PROCESSES * ITEMS, (PROCESSES + 1) * ITEMS))
            engine = DaskEngine(client=client, partition_size=25)
            g = Graph([R.slow_inc, R.slow_square], engine=engine, cache=DiskCache(path))
            while time.time() < go:
                time.sleep(0.005)
            res = g.map({"x": xs, "delay": 0.0}, map_over="x")
            assert [r["z"] for r in res] == [(x + 1) ** 2 for x in xs]
            outs = [p.communicate(timeout=180) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        # the workers' logs: a degraded cache on a worker would warn there
        worker_logs = "\n".join(
            line for logs in client.get_worker_logs().values() for _, line in logs)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert out.strip() == "done"
        assert "database is locked" not in err
    assert "database is locked" not in worker_logs
    assert "caching is disabled" not in worker_logs

    _every_write_is_a_hit(path, (PROCESSES + 1) * ITEMS)


def _every_write_is_a_hit(path, total):
    """The cache at ``path`` holds both nodes of ``total`` items; a warm map runs none."""
    cache = DiskCache(path)
    assert cache.stats()["entries"] == 2 * total  # two cached nodes per item

    class Hits:
        ran = 0
        hit = 0

        def on_node_end(self, event):
            if event.cached:
                Hits.hit += 1
            else:
                Hits.ran += 1

    every = list(range(total))
    warm = Graph([R.slow_inc, R.slow_square], cache=cache, callbacks=[Hits()])
    res = warm.map({"x": every, "delay": 0.0}, map_over="x")
    assert [r["z"] for r in res] == [(x + 1) ** 2 for x in every]
    LOST.append(Hits.ran)
    assert Hits.ran == 0 and Hits.hit == 2 * total  # 0 lost writes
