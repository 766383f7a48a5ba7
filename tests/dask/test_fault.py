"""Fault tolerance on a real cluster: `dask scheduler` + two `dask worker` processes on loopback.

One worker is killed with SIGKILL while the map runs; the scheduler reschedules the lost
partitions (their items are in the graph, the shared payload is replicated on every worker),
and the map still returns every result, correct and in item order.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from hypernodes_dask import DaskEngine
from hypernodes_dist import Graph
from tests.procs import dask_cluster

from . import nodes as N

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")


@pytest.fixture
def real_cluster(tmp_path):
    with dask_cluster(tmp_path, workers=2) as cluster:
        yield cluster


def _wait_for_worker_count(client, n: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while len(client.nthreads()) != n and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(client.nthreads())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkill_a_worker_mid_map_still_returns_every_result(real_cluster):
    address, workers = real_cluster
    engine = DaskEngine(address=address, partition_size=2)
    try:
        engine.client.wait_for_workers(2, timeout=60)
        victim = workers[0]
        done: list[int] = []

        class KillAfterFirstBatch:
            """Runs in the driver as results arrive: kill a worker once work is under way."""

            def on_node_end(self, event):
                done.append(event.item_index)
                if len(done) == 1:
                    os.kill(victim.pid, signal.SIGKILL)

        xs = list(range(60))
        g = Graph([N.slow_square], engine=engine, callbacks=[KillAfterFirstBatch()])
        res = g.map({"x": xs, "delay": 0.05}, map_over="x")
        assert victim.wait(timeout=10) == -signal.SIGKILL
        assert [r["slow"] for r in res] == [x * x for x in xs]
        assert all(r.status == "complete" for r in res) and len(done) == len(xs)
        assert _wait_for_worker_count(engine.client, 1) == 1  # the scheduler saw it die
    finally:
        engine.close()
