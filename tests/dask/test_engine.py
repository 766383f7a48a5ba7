"""DaskEngine specifics: construction, graph shape, shipping, cache, errors, clients."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import threading
import time

import cloudpickle
import pytest

from hypernodes_dask import DaskEngine, UnpicklableError, auto_partition_size
from hypernodes_dask.compile import Shipment, build_graph, pickle_payload
from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.errors import NodeError
from hypernodes_dist.events import NodeEndEvent
from hypernodes_dist.execution.job import BatchSettings, MapJob
from hypernodes_dist.plan import compile_plan

from ..conformance import graphs as G
from . import nodes as N


def make_job(n: int, broadcast: dict | None = None) -> MapJob:
    plan = compile_plan(N.CHAIN)
    return MapJob(plan, {"x": list(range(n))}, dict(broadcast or {}), n,
                  BatchSettings(session_id="s", run_prefix="r-"))


class Ends:
    def __init__(self) -> None:
        self.events: list[NodeEndEvent] = []

    def on_node_end(self, event: NodeEndEvent) -> None:
        self.events.append(event)


# ------------------------------------------------------------------ construction


def test_constructor_validation():
    with pytest.raises(ValueError, match="scheduler"):
        DaskEngine(scheduler="gpu")
    with pytest.raises(ValueError, match="not both"):
        DaskEngine(client=object(), address="tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="partition_size"):
        DaskEngine(partition_size=0)
    eng = DaskEngine(address="tcp://127.0.0.1:1")  # lazy: nothing connects yet
    assert eng.scheduler == "distributed" and eng.supports_iter is False
    eng.close()


def test_found_through_the_entry_point():
    from hypernodes_dist.engines import DaskEngine as Plugin
    from hypernodes_dist.engines import get_engine

    assert Plugin is DaskEngine and get_engine("dask") is DaskEngine
    assert isinstance(Graph(N.CHAIN, engine="dask").engine, DaskEngine)


def test_iter_raises_type_error_naming_the_engine():
    g = Graph(N.CHAIN, engine=DaskEngine())
    if not hasattr(g, "iter"):
        pytest.skip("Graph.iter is not in the core yet")
    with pytest.raises(TypeError, match="(?i)dask"):
        g.iter({"x": 1})


# ------------------------------------------------------------------ graph shape


def test_auto_partition_size_rule():
    assert auto_partition_size(1_000, 2) == 125  # ~4 tasks per worker
    assert auto_partition_size(100_000, 2) == 10_000  # capped
    assert auto_partition_size(3, 8) == 1
    assert auto_partition_size(10**6, 64) == math.ceil(10**6 / 256)
    assert auto_partition_size(50, 2, tasks_per_worker=1, max_size=20) == 20


def test_partition_size_follows_workers_and_override():
    assert DaskEngine(scheduler="threads", num_workers=3).partition_size_for(1_200) == 100
    assert DaskEngine(scheduler="sync").partition_size_for(1_200) == 300
    assert DaskEngine(scheduler="threads", partition_size=17).partition_size_for(1_200) == 17


def test_num_workers_is_honoured_on_threads():
    eng = DaskEngine(scheduler="threads", num_workers=3, partition_size=1)
    res = Graph([N.which_thread], engine=eng).map({"x": list(range(30))}, map_over="x")
    assert 1 < len({r["thread"] for r in res}) <= 3


@pytest.mark.parametrize("n,size", [(1, 5), (10, 3), (1_000, 100), (100_000, 10_000)])
def test_task_count_is_items_over_partition_size(n, size):
    dsk, keys = build_graph(make_job(n), size, shared="payload")
    assert len(keys) == math.ceil(n / size)
    assert len(dsk) == len(keys) + 1  # + the one shared key, whatever the node count


def test_keys_are_unique_per_map_call():
    job = make_job(10)
    _, a = build_graph(job, 3, shared="p")
    _, b = build_graph(job, 3, shared="p")
    assert not set(a) & set(b)


def test_broadcast_is_in_the_graph_once():
    big = os.urandom(1 << 20)
    job = make_job(200, {"y": big})
    shipment = pickle_payload(job, "test")
    dsk, keys = build_graph(job, 4, shared=Shipment(shipment.digest, path="/tmp/x.pkl"))
    per_task = [len(cloudpickle.dumps(dsk[k])) for k in keys]
    assert len(keys) == 50 and max(per_task) < 2_000  # tasks carry their items only
    assert len(shipment.data) > len(big)  # the payload holds the broadcast, once


# ------------------------------------------------------------------ running


def test_map_on_every_scheduler(any_engine):
    xs = list(range(1_000))
    res = Graph(N.CHAIN, engine=any_engine).map({"x": xs, "y": "k"}, map_over="x")
    assert [r["c"] for r in res] == [f"{(x + 1) * 2}-k" for x in xs]


def test_sink_gets_every_partition_in_the_driver(any_engine):
    job = make_job(50)
    calls: list[tuple[int, int, bool]] = []
    any_engine.execute_map(
        job, lambda b: calls.append((b.offset, b.n, threading.current_thread() is threading.main_thread()))
    )
    size = any_engine.partition_size_for(50)
    assert len(calls) == math.ceil(50 / size) > 1
    assert sorted((o, n) for o, n, _ in calls) == [(a, b - a) for a, b in job.bounds(size)]
    assert all(main for *_, main in calls)


def test_progress_bar_counts_items(any_engine, capsys):
    Graph(N.CHAIN, engine=any_engine).map({"x": list(range(40))}, map_over="x", progress=True)
    err = capsys.readouterr().err
    assert "map [dask]" in err and "40/40" in err


def test_remote_tasks_run_in_other_processes(remote_engine):
    res = Graph([N.where], engine=remote_engine).map({"x": list(range(40))}, map_over="x")
    assert os.getpid() not in {r["pid"] for r in res}


def test_large_broadcast_reaches_every_item(remote_engine):
    blob = b"z" * (4 << 20)
    g = Graph([N.blob_size], engine=remote_engine)
    out = g.map({"x": list(range(64)), "blob": blob}, map_over="x")
    assert [r["size"] for r in out] == [len(blob) + x for x in range(64)]


def test_cache_is_shared_with_the_local_engine(any_engine, tmp_path):
    cache = DiskCache(tmp_path / "cache")
    cold, local, warm = Ends(), Ends(), Ends()
    first = Graph(N.CHAIN, engine=any_engine, cache=cache, callbacks=[cold]).map(
        {"x": list(range(30))}, map_over="x")
    assert len(cold.events) == 90 and not any(e.cached for e in cold.events)
    again = Graph(N.CHAIN, cache=cache, callbacks=[local]).map({"x": list(range(30))}, map_over="x")
    assert len(local.events) == 90 and all(e.cached for e in local.events)
    assert [dict(r) for r in again] == [dict(r) for r in first]
    more = Graph(N.CHAIN, engine=any_engine, cache=cache, callbacks=[warm]).map(
        {"x": list(range(40))}, map_over="x")
    hits = {(e.item_index, e.node_id) for e in warm.events if e.cached}
    assert len(warm.events) == 120 and hits == {(i, n) for i in range(30) for n in ("inc", "double", "fmt")}
    assert [r["c"] for r in more] == [f"{(x + 1) * 2}-y" for x in range(40)]
    assert [h.cached for h in more[3].history] == [True] * 3


# ------------------------------------------------------------------ pickling checks


def test_unpicklable_node_fails_before_submission(remote_engine):
    lock = threading.Lock()

    def locked(x: int) -> int:
        with lock:
            return x

    from hypernodes_dist import node

    g = Graph([node(output_name="y")(locked)], engine=remote_engine)
    with pytest.raises(UnpicklableError, match="node 'locked'") as info:
        g.map({"x": [1, 2]}, map_over="x")
    assert isinstance(info.value, TypeError) and info.value.__cause__ is not None
    threads = Graph([node(output_name="y")(locked)], engine=DaskEngine(scheduler="threads"))
    assert [r["y"] for r in threads.map({"x": [1, 2]}, map_over="x")] == [1, 2]


def test_unpicklable_inputs_are_named(remote_engine):
    g = Graph([N.uses_handle], engine=remote_engine)
    with pytest.raises(UnpicklableError, match="input 'handle'"):
        g.map({"x": [1, 2], "handle": threading.Lock()}, map_over="x")
    with pytest.raises(UnpicklableError, match=r"input 'handle' \(item 0\)"):
        g.map({"x": [1, 2], "handle": [threading.Lock(), threading.Lock()]},
              map_over=["x", "handle"])


# ------------------------------------------------------------------ errors


def test_raise_keeps_type_notes_and_attributes(any_engine):
    g = Graph(G.FRAGILE, engine=any_engine)
    with pytest.raises(G.ItemFailure) as info:
        g.map({"x": list(range(30)), "bad": (17,)}, map_over="x")
    assert info.value.hn_node == "fragile" and info.value.hn_item == 17
    assert any("item 17" in n for n in info.value.__notes__)


def test_an_error_its_args_cannot_rebuild_crosses_as_its_own_class(any_engine):
    g = Graph([N.explode], engine=any_engine)
    with pytest.raises(N.Unpicklable, match="bad pair 5/0") as info:
        g.map({"x": list(range(10))}, map_over="x")
    err = info.value
    assert err.hn_node == "explode" and err.hn_item == 5
    res = g.map({"x": list(range(10))}, map_over="x", on_error="collect")
    assert [r.status for r in res].count("error") == 1 and "explode" in " ".join(res[5].error.__notes__)
    assert type(res[5].error) is N.Unpicklable


def test_an_error_whose_state_cannot_cross_becomes_a_node_error(any_engine):
    g = Graph([N.lock_holder], engine=any_engine)
    res = g.map({"x": list(range(10))}, map_over="x", on_error="collect")
    err = res[5].error
    assert isinstance(err, NodeError) and err.original_type == "Unportable"
    assert "held lock at 5" in str(err) and err.hn_node == "lock_holder" and err.hn_item == 5


def _batch_tasks(dask_scheduler) -> int:
    return sum(1 for k in dask_scheduler.tasks if "hn-" in str(k) or "Shipment" in str(k))


def _wait_until_released(client, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(_batch_tasks) and time.monotonic() < deadline:
        time.sleep(0.05)
    return client.run_on_scheduler(_batch_tasks)


def test_cluster_memory_is_released_after_a_map(distributed_engine):
    res = Graph(N.CHAIN, engine=distributed_engine).map({"x": list(range(100))}, map_over="x")
    assert len(res) == 100
    assert _wait_until_released(distributed_engine.client) == 0


def test_raise_cancels_the_remaining_tasks(distributed_engine, tmp_path):
    client = distributed_engine.client
    g = Graph([N.fail_after], engine=DaskEngine(client=client, partition_size=1))
    n = 40  # 10 s of calls on the 2 workers: the first failure comes after 0.5 s
    with pytest.raises(ValueError, match="is bad") as info:
        g.map({"x": list(range(n)), "log_dir": str(tmp_path), "delay": 0.5}, map_over="x")
    assert info.value.hn_node == "fail_after"

    assert _wait_until_released(client) == 0
    assert len(os.listdir(tmp_path)) < n  # the calls not yet started never ran


def test_impure_work_is_never_deduplicated(distributed_engine, tmp_path):
    g = Graph([N.record_call], engine=distributed_engine)
    inputs = {"x": list(range(16)), "log_dir": str(tmp_path)}
    threads = [threading.Thread(target=g.map, args=(inputs, "x")) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    g.map(inputs, "x")
    assert len(os.listdir(tmp_path)) == 48


# ------------------------------------------------------------------ clients and clusters


def test_an_existing_client_is_never_closed(client):
    eng = DaskEngine(client=client)
    assert [r["c"] for r in Graph(N.CHAIN, engine=eng).map({"x": [1]}, map_over="x")] == ["4-y"]
    eng.close()
    assert client.status == "running"
    assert client.submit(sum, [1, 2]).result() == 3


def test_address_connects_its_own_client_and_closes_it(cluster):
    eng = DaskEngine(address=cluster.scheduler_address, partition_size=3)
    res = Graph(N.CHAIN, engine=eng).map({"x": list(range(10))}, map_over="x")
    assert [r["a"] for r in res] == list(range(1, 11))
    own = eng.client
    assert eng.workers() == 2
    eng.close()
    assert own.status == "closed"


def test_distributed_without_client_starts_and_stops_a_local_cluster():
    eng = DaskEngine(scheduler="distributed", num_workers=1,
                     cluster_kwargs={"processes": False, "threads_per_worker": 2,
                                     "dashboard_address": None})
    res = Graph(N.CHAIN, engine=eng).map({"x": list(range(10))}, map_over="x")
    assert [r["b"] for r in res] == [(x + 1) * 2 for x in range(10)]
    cluster = eng._cluster._cluster
    assert eng.workers() == 2
    eng.close()
    assert eng._cluster.started is False and cluster.status.name == "closed"


@pytest.mark.slow
def test_main_module_nodes_run_on_worker_processes(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        from hypernodes_dist import Graph, node
        from hypernodes_dask import DaskEngine

        @node(output_name="y")
        def triple(x: int) -> int:
            return 3 * x

        if __name__ == "__main__":
            with DaskEngine(scheduler="processes", num_workers=2, partition_size=2) as eng:
                res = Graph([triple], engine=eng).map({"x": list(range(9))}, map_over="x")
            print([r["y"] for r in res])
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str([3 * x for x in range(9)])
