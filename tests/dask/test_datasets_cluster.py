"""Dataset maps on a real ``distributed`` cluster: ``dask scheduler`` / ``dask worker``
processes on 127.0.0.1, started by the test.

- the workers read the Parquet source and write the output files themselves;
- a worker that cannot see the ``into`` directory (here: a worker in its own mount
  namespace, with an empty tmpfs over the test's directory, as on another machine) makes
  the map raise before anything runs, naming that worker.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hypernodes_dist import Graph
from tests.conformance import dataset_graphs as D
from tests.procs import spawn, stop, wait_for_address

pytest.importorskip("hypernodes_dask")


def _can_unshare() -> bool:
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "--mount", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _wait_workers(client, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(client.scheduler_info(n_workers=-1)["workers"]) < n:
        assert time.monotonic() < deadline, f"fewer than {n} workers joined"
        time.sleep(0.1)


@contextlib.contextmanager
def _cluster(tmp_path):
    """A ``dask scheduler`` and one worker named "seeing" on 127.0.0.1: ``(client, address,
    procs, logs)``; every process is stopped at the end."""
    from distributed import Client

    logs = tmp_path / "logs"
    logs.mkdir()
    scheduler_file = tmp_path / "scheduler.json"
    procs = [spawn("distributed.cli.dask_scheduler",
                   ["--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                    "--scheduler-file", str(scheduler_file)], logs / "scheduler.log")]
    try:
        address = wait_for_address(scheduler_file, procs[0])
        procs.append(spawn("distributed.cli.dask_worker",
                           [address, "--nthreads", "1", "--name", "seeing",
                            "--dashboard-address", ":0"], logs / "worker.log"))
        with Client(address, set_as_default=False) as client:
            _wait_workers(client, 1)
            yield client, address, procs, logs
    finally:
        stop(procs)


@pytest.mark.timeout(180)
def test_workers_write_the_dataset(tmp_path):
    from hypernodes_dask import DaskEngine

    with _cluster(tmp_path) as (client, _, _, _):
        src = tmp_path / "src.parquet"
        pq.write_table(pa.table({"body": D.texts(30)}), src, row_group_size=8)
        g = Graph(D.ENRICH, engine=DaskEngine(client=client, partition_size=8))
        res = g.map(source=str(src), columns={"text": "body"}, into=tmp_path / "out")
        assert res.rows == 30 and len(list((tmp_path / "out").glob("part-*"))) == 4
        assert res.to_arrow().column("clean").to_pylist() == [
            D.expected(t)["clean"] for t in D.texts(30)]


@pytest.mark.timeout(180)
@pytest.mark.skipif(not _can_unshare(),
                    reason="a worker on 'another machine' needs mount namespaces (root on Linux)")
def test_a_worker_that_cannot_see_into_is_named_before_anything_runs(tmp_path):
    from hypernodes_dask import DaskEngine

    with _cluster(tmp_path) as (client, address, procs, logs):
        blind_dir = tmp_path / "blind"
        blind_dir.mkdir()
        worker = (f"mount -t tmpfs none {blind_dir} && exec {sys.executable} -m "
                  f"distributed.cli.dask_worker {address} --nthreads 1 --name blind "
                  "--dashboard-address :0")
        with open(logs / "blind.log", "ab") as out:
            procs.append(subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", worker],
                stdout=out, stderr=out, start_new_session=True, env=dict(os.environ)))
        _wait_workers(client, 2)
        calls = tmp_path / "calls"
        calls.mkdir()
        g = Graph([D.logged_square], engine=DaskEngine(client=client, partition_size=8))
        with pytest.raises(ValueError, match="not visible from Dask worker.*'blind'") as info:
            g.map(source=pa.table({"x": list(range(30))}), inputs={"log_dir": str(calls)},
                  into=blind_dir / "out")
        assert "'seeing'" not in str(info.value)
        assert D.logged(calls) == []  # no node ran, not even to type the outputs
        assert not list((blind_dir / "out").glob("part-*"))
