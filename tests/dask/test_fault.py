"""Fault tolerance on a real cluster: `dask scheduler` + two `dask worker` processes on loopback.

One worker is killed with SIGKILL while the map runs; the scheduler reschedules the lost
partitions (their items are in the graph, the shared payload is replicated on every worker),
and the map still returns every result, correct and in item order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hypernodes_dask import DaskEngine
from hypernodes_dist import Graph
from tests.procs import spawn, stop, wait_for_address

from . import nodes as N

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")


@pytest.fixture
def real_cluster(tmp_path):
    sched_file = tmp_path / "scheduler.json"
    log = tmp_path / "cluster.log"
    procs: list[subprocess.Popen] = []
    try:
        sched = spawn("distributed.cli.dask_scheduler", ["--host", "127.0.0.1", "--port", "0",
                        "--no-dashboard", "--scheduler-file", str(sched_file)], log)
        procs.append(sched)
        address = wait_for_address(sched_file, sched)
        workers = [
            spawn("distributed.cli.dask_worker", ["--scheduler-file", str(sched_file),
                    "--host", "127.0.0.1", "--nthreads", "1", "--no-nanny", "--no-dashboard",
                    "--memory-limit", "0", "--name", f"w{i}"], log)
            for i in range(2)
        ]
        procs.extend(workers)
        yield address, workers
    finally:
        stop(procs)  # only the processes this fixture started


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
