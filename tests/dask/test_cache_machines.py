"""A cache across machines, simulated with real `dask worker` processes whose local view differs.

Each "machine" is a `dask worker` started in its own working directory with its own ``HOME``:
a relative (or home-based) cache path means a different directory there, as on another host.

- a ``DiskCache`` the workers cannot see raises before the map runs, naming the worker and
  pointing to ``ObjectStoreCache`` (and nothing ran, no empty cache was started there);
- with an ``ObjectStoreCache`` on a shared directory or on an S3-compatible endpoint (moto's
  server, started by the test on 127.0.0.1), a map on machine A and its rerun on machine B,
  after A is gone, is 100% cache hits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hypernodes_dask import DaskEngine
from hypernodes_dist import DiskCache, Graph, ObjectStoreCache, node
from hypernodes_dist.cache import CacheNotVisibleError
from tests.conformance import graphs as G
from tests.dask.s3_writers import s3_limited_writer, s3_writer
from tests.fresh import FRESH, S3_ENV
from tests.procs import spawn, stop, wait_for_address

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.skipif(sys.platform == "win32", reason="process groups")]

ROOT = Path(__file__).resolve().parents[2]


class Cluster:
    """A `dask scheduler` and named `dask worker` "machines" (own cwd and HOME each)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.log = tmp / "cluster.log"
        self.procs: list[subprocess.Popen] = []
        self.workers: dict[str, subprocess.Popen] = {}
        sched_file = tmp / "scheduler.json"
        self.sched_file = sched_file
        sched = spawn("distributed.cli.dask_scheduler", ["--host", "127.0.0.1", "--port", "0",
                      "--no-dashboard", "--scheduler-file", str(sched_file)], self.log)
        self.procs.append(sched)
        self.address = wait_for_address(sched_file, sched)

    def machine(self, name: str) -> Path:
        home = self.tmp / name
        home.mkdir(exist_ok=True)
        env = {"HOME": str(home), "PYTHONPATH": str(ROOT), **S3_ENV}
        proc = spawn("distributed.cli.dask_worker", [
            "--scheduler-file", str(self.sched_file), "--host", "127.0.0.1", "--nthreads", "1",
            "--no-nanny", "--no-dashboard", "--memory-limit", "0", "--name", name],
            self.log, env=env, cwd=home)
        self.procs.append(proc)
        self.workers[name] = proc
        return home

    def leave(self, name: str) -> None:
        stop([self.workers.pop(name)])

    def close(self) -> None:
        stop(list(self.workers.values()))  # workers first: they close cleanly while the
        stop(self.procs)  # scheduler still answers (then the scheduler and any leftovers)


def wait_for(client, names: set[str], timeout: float = 60) -> dict[str, str]:
    """Wait until exactly the workers ``names`` are connected; ``{name: address}``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = client.scheduler_info()["workers"]
        found = {w["name"]: addr for addr, w in workers.items()}
        if set(found) == names:
            return found
        time.sleep(0.1)
    raise TimeoutError(f"workers {names} did not (only) connect; log: {found}")


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


class Ends:
    def __init__(self) -> None:
        self.events: list = []

    def on_node_end(self, event) -> None:
        self.events.append(event)


def test_disk_cache_a_worker_cannot_see_raises_before_the_map(cluster, tmp_path, monkeypatch):
    here = cluster.machine("machine-a")
    there = cluster.machine("machine-b")
    monkeypatch.chdir(here)  # the driver runs on machine A
    logs = tmp_path / "logs"
    logs.mkdir()
    engine = DaskEngine(address=cluster.address)
    try:
        names = wait_for(engine.client, {"machine-a", "machine-b"})
        g = Graph(G.COUNTED, engine=engine, cache=DiskCache(".cache"))
        with pytest.raises(CacheNotVisibleError) as err:
            g.map({"x": list(range(8)), "log_dir": str(logs)}, map_over="x")
    finally:
        engine.close()
    message = str(err.value)
    assert names["machine-b"] in message and names["machine-a"] not in message
    assert "ObjectStoreCache" in message and "DiskCache('.cache')" in message
    assert G.executions(logs) == []  # raised before anything ran
    assert not (there / ".cache").exists()  # no empty cache silently started on machine B
    assert (here / ".cache").is_dir()


def test_a_worker_process_checks_lazily_too(tmp_path, monkeypatch):
    """Engines without a pre-check: the cache itself refuses in a process that cannot see it."""
    here, there = tmp_path / "a", tmp_path / "b"
    here.mkdir()
    there.mkdir()
    monkeypatch.chdir(here)
    cache = DiskCache(".cache")
    cache.prepare()
    import pickle

    blob = tmp_path / "cache.pickle"
    blob.write_bytes(pickle.dumps(cache))
    code = ("import pickle, sys; c = pickle.load(open(sys.argv[1], 'rb')); c.get_many(['k'])")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    same = subprocess.run([sys.executable, "-c", code, str(blob)], cwd=here, env=env,
                          capture_output=True, text=True, timeout=60)
    assert same.returncode == 0, same.stderr
    other = subprocess.run([sys.executable, "-c", code, str(blob)], cwd=there, env=env,
                           capture_output=True, text=True, timeout=60)
    assert other.returncode != 0
    assert "CacheNotVisibleError" in other.stderr and "ObjectStoreCache" in other.stderr
    assert not (there / ".cache").exists()


@pytest.fixture
def s3_url(monkeypatch):
    """An S3-compatible endpoint on 127.0.0.1: moto's server (an emulator; see the README)."""
    import logging

    from moto.server import ThreadedMotoServer

    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(endpoint_override=f"http://{host}:{port}", scheme="http",
                               region="us-east-1", allow_bucket_creation=True)
        fs.create_dir("hn-bucket")
        # moto keeps its objects per process, across servers: a fresh prefix per test
        yield (f"s3://hn-bucket/cache-{uuid.uuid4().hex[:8]}?endpoint_override=http://"
               f"{host}:{port}&scheme=http&region=us-east-1")
    finally:
        server.stop()


@pytest.mark.parametrize("where", ["shared-dir", "s3"])
def test_rerun_on_another_machine_is_all_hits(cluster, tmp_path, where, request):
    url = str(tmp_path / "shared") if where == "shared-dir" else request.getfixturevalue("s3_url")
    logs = tmp_path / "logs"
    logs.mkdir()
    inputs = {"x": list(range(40)), "log_dir": str(logs)}
    cluster.machine("machine-a")
    engine = DaskEngine(address=cluster.address, partition_size=5)
    try:
        wait_for(engine.client, {"machine-a"})
        cold = Graph(G.COUNTED, engine=engine, cache=ObjectStoreCache(url)).map(inputs, map_over="x")
        assert sorted(G.executions(logs)) == list(range(40))
        cluster.leave("machine-a")
        cluster.machine("machine-b")
        wait_for(engine.client, {"machine-b"})
        ends = Ends()
        warm = Graph(G.COUNTED, engine=engine, cache=ObjectStoreCache(url),
                     callbacks=[ends]).map(inputs, map_over="x")
    finally:
        engine.close()
    assert sorted(G.executions(logs)) == list(range(40))  # nothing ran again on machine B
    assert len(ends.events) == 80 and all(e.cached for e in ends.events)
    assert {e.worker for e in ends.events} != {""}
    assert [r["counted_plus"] for r in warm] == [r["counted_plus"] for r in cold]
    assert [r["counted_plus"] for r in warm] == [3 * x + 1 for x in range(40)]


CALLS: list[int] = []  # module level: a closure's value would be part of the code identity


@node(output_name="sq")
def square(x: int) -> int:
    CALLS.append(x)
    return x * x


@pytest.mark.parametrize("damage", [lambda b: b"\x00garbage", lambda b: b[: len(b) // 2]],
                         ids=["garbage", "truncated"])
def test_s3_corrupt_objects_are_misses_and_recomputed(s3_url, damage):
    import pyarrow.fs as pafs

    calls = CALLS
    calls.clear()
    g = Graph([square], cache=ObjectStoreCache(s3_url))
    assert [r["sq"] for r in g.map({"x": [1, 2, 3]}, map_over="x")] == [1, 4, 9]
    fs, root = pafs.FileSystem.from_uri(s3_url)
    objects = [i for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))
               if i.type == pafs.FileType.File and i.path.endswith(".seg")]
    assert objects
    for info in objects:
        with fs.open_input_stream(info.path) as f:
            data = f.read()
        with fs.open_output_stream(info.path) as out:
            out.write(damage(data))
    again = Graph([square], cache=ObjectStoreCache(s3_url)).map({"x": [1, 2, 3]}, map_over="x")
    assert [r["sq"] for r in again] == [1, 4, 9]
    assert sorted(calls) == [1, 1, 2, 2, 3, 3]
    third = Graph([square], cache=ObjectStoreCache(s3_url)).map({"x": [1, 2, 3]}, map_over="x")
    assert [r["sq"] for r in third] == [1, 4, 9] and len(calls) == 6  # rewritten, now hits
    stats = ObjectStoreCache(s3_url).stats()
    assert stats["by_node"]["square"]["entries"] == 3


@pytest.mark.slow
def test_eight_processes_writing_to_s3_lose_nothing(s3_url):
    """8 writer processes x 20 writes on one S3 prefix at once (each write: two new objects)."""
    ctx = FRESH
    with ctx.Pool(8) as pool:
        assert sorted(pool.starmap(s3_writer, [(s3_url, w, 20) for w in range(8)])) == list(
            range(8))
    keys = [f"w{w}-{i}" for w in range(8) for i in range(20)]
    got = ObjectStoreCache(s3_url).get_many(keys)
    assert len(got) == 160 and got["w5-17"] == {"worker": 5, "i": 17}
    assert ObjectStoreCache(s3_url).stats()["entries"] == 160



def _s3_bytes(url: str) -> int:
    """Bytes of the segments and indexes under an S3 cache URL (one LIST)."""
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(url)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return sum(i.size or 0 for i in infos if i.path.endswith((".seg", ".idx")))


@pytest.mark.timeout(300)
def test_s3_size_limit_with_processes_and_prune_from_the_cli(s3_url):
    """Four processes ("machines": they share only the bucket) write 6 batches of 10 KB each
    into a 60 KB S3 cache (four times the limit: eviction starts in the second batch):
    afterwards it holds at most the limit, what is left reads back right, and
    ``hypernodes-dist cache prune URL --max-size`` trims it further, printing what it did.
    (A batch, written then read, is ~80 requests to moto at ~2.5 ms of its CPU each: 12
    batches cost 13.6 CPU s, 6 cost 5.9.)"""
    limit, batches = 60_000, 6
    ctx = FRESH
    with ctx.Pool(4) as pool:
        assert sorted(pool.starmap(s3_limited_writer, [(s3_url, w, batches, limit)
                                                       for w in range(4)])) == [0, 1, 2, 3]
    assert 0 < _s3_bytes(s3_url) <= limit
    keys = [f"w{w}-{b}-{i}" for w in range(4) for b in range(batches) for i in range(5)]
    found = ObjectStoreCache(s3_url).get_many(keys, node="n")
    assert 0 < len(found) < len(keys)
    assert all(v == f"{k[1:]}:" + "v" * 2000 for k, v in found.items())
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-m", "hypernodes_dist.cli", "cache", "prune", s3_url,
                          "--max-size", "20KB"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("removed ") and "beyond 20KB" in out.stdout
    assert _s3_bytes(s3_url) <= 20_000
