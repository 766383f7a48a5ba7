"""Resources on a real cluster: `dask scheduler` + two `dask worker` processes on loopback.

Each worker process builds a resource at most once across maps (the object, which holds a
lock, is never shipped), and closing the engine tears it down on every worker that built it.
"""

from __future__ import annotations

import time

import pytest

from hypernodes_dask import DaskEngine
from hypernodes_dist import Graph
from tests.procs import dask_cluster

from . import resource_nodes as R


@pytest.fixture
def real_cluster(tmp_path):
    with dask_cluster(tmp_path, workers=2, nthreads=2) as (address, workers):
        yield address, [p.pid for p in workers]


def _wait_for_files(log_dir, kind: str, n: int, timeout: float = 30) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = R.events(log_dir)[kind]
        if sum(found.values()) >= n:
            return found
        time.sleep(0.1)
    return R.events(log_dir)[kind]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_each_worker_builds_once_across_maps_and_tears_down_on_close(real_cluster, tmp_path):
    address, worker_pids = real_cluster
    log_dir = tmp_path / "events"
    log_dir.mkdir()
    engine = DaskEngine(address=address, partition_size=5)
    assert engine.address == address and address in repr(engine)
    engine.client.wait_for_workers(2, timeout=60)
    graph = Graph([R.tracked, R.use_tracked], engine=engine)
    assert graph.inputs == ("log_dir", "x")
    xs = list(range(80))
    for _ in range(2):
        res = graph.map({"x": xs, "log_dir": str(log_dir)}, map_over="x")
        assert [r["seen"][0] for r in res] == [x * 2 for x in xs]
    used = {r["seen"][1] for r in res}
    builds = R.events(log_dir)["build"]
    assert set(builds) <= set(worker_pids) and used <= set(builds)  # built in the workers
    assert all(count == 1 for count in builds.values())  # once per process, across maps
    engine.close()
    teardowns = _wait_for_files(log_dir, "teardown", len(builds))
    assert teardowns == builds  # every process that built it tore it down, once
