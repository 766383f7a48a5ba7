"""The shared cache on every engine, for each backend (``DiskCache``, ``ObjectStoreCache`` on a
directory): same keys everywhere, hits reported, per-item reuse."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

from hypernodes_dist import DiskCache, Graph, GraphEngine, ObjectStoreCache, node

from . import graphs as G


class Ends:
    def __init__(self) -> None:
        self.events = []

    def on_node_end(self, event) -> None:
        self.events.append(event)


@pytest.fixture(params=[DiskCache, ObjectStoreCache], ids=["disk", "objects"])
def store(request):
    """The backend under test: ``store(path, scope=...)`` makes a cache."""
    return request.param


def test_warm_map_is_all_hits_with_events(engine, store, tmp_path, logs):
    cache = store(tmp_path / "c")
    inputs = {"x": list(range(25)), "log_dir": str(logs)}
    cold = Graph(G.COUNTED, engine=engine, cache=cache).map(inputs, map_over="x")
    assert G.executions(logs) == list(range(25))
    ends = Ends()
    warm = Graph(G.COUNTED, engine=engine, cache=cache, callbacks=[ends]).map(inputs, map_over="x")
    assert G.executions(logs) == list(range(25))  # nothing ran again
    assert [r["counted_plus"] for r in warm] == [r["counted_plus"] for r in cold]
    assert len(ends.events) == 50 and all(e.cached for e in ends.events)
    assert all(h.cached for r in warm for h in r.history)


def test_cache_written_by_local_is_a_full_hit_on_engine(engine, store, tmp_path, logs):
    cache = store(tmp_path / "c")
    inputs = {"x": list(range(30)), "log_dir": str(logs)}
    Graph(G.COUNTED, engine=GraphEngine(), cache=cache).map(inputs, map_over="x")
    res = Graph(G.COUNTED, engine=engine, cache=cache).map(inputs, map_over="x", select=["counted_plus"])
    assert G.executions(logs) == list(range(30))
    assert [r["counted_plus"] for r in res] == [x * 3 + 1 for x in range(30)]


def test_cache_written_by_engine_is_a_full_hit_locally(engine, store, tmp_path, logs):
    cache = store(tmp_path / "c")
    inputs = {"x": list(range(30)), "log_dir": str(logs)}
    Graph(G.COUNTED, engine=engine, cache=cache).map(inputs, map_over="x")
    ends = Ends()
    Graph(G.COUNTED, cache=cache, callbacks=[ends]).map(inputs, map_over="x")
    assert G.executions(logs) == list(range(30))
    assert all(e.cached for e in ends.events) and len(ends.events) == 60


def test_only_new_items_execute(engine, store, tmp_path, logs):
    g = Graph(G.COUNTED, engine=engine, cache=store(tmp_path / "c"))
    g.map({"x": [1, 2], "log_dir": str(logs)}, map_over="x")
    res = g.map({"x": [1, 2, 3], "log_dir": str(logs)}, map_over="x")
    assert G.executions(logs) == [1, 2, 3]
    assert [r["counted"] for r in res] == [3, 6, 9]


def test_uncached_node_always_runs(engine, store, tmp_path, logs):
    g = Graph(G.COUNTED + [G.never_cached], engine=engine, cache=store(tmp_path / "c"))
    for _ in range(2):
        res = g.map({"x": [1, 2], "log_dir": str(logs)}, map_over="x", select=["counted"])
    assert G.executions(logs) == [1, 2]
    assert G.executions(logs, "nc-") == [4, 4, 7, 7]
    assert [r["counted"] for r in res] == [3, 6]


def test_none_is_cached_as_a_hit(engine, store, tmp_path):
    ends = Ends()
    g = Graph([G.returns_none], engine=engine, cache=store(tmp_path / "c"), callbacks=[ends])
    g.map({"x": [1, 2]}, map_over="x")
    res = g.map({"x": [1, 2]}, map_over="x")
    assert [e.cached for e in ends.events] == [False, False, True, True]
    assert all(r["nothing"] is None for r in res)


def test_session_and_run_scopes(engine, store, tmp_path, logs):
    inputs = {"x": [1], "log_dir": str(logs)}
    g = Graph(G.COUNTED, engine=engine, cache=store(tmp_path / "s", scope="session"))
    g.map(inputs, map_over="x", session_id="a")
    g.map(inputs, map_over="x", session_id="a")
    assert G.executions(logs) == [1]
    g.map(inputs, map_over="x", session_id="b")
    assert G.executions(logs) == [1, 1]
    r = Graph(G.COUNTED, engine=engine, cache=store(tmp_path / "r", scope="run"))
    r.map(inputs, map_over="x", session_id="a")
    r.map(inputs, map_over="x", session_id="a")
    assert G.executions(logs) == [1, 1, 1, 1]


def test_control_flow_graph_is_cached(engine, store, tmp_path):
    ends = Ends()
    g = Graph(G.CYCLE, engine=engine, cache=store(tmp_path / "c"), callbacks=[ends])
    first = g.map({"topic": ["ab", "abcdef"], "target": 9}, map_over="topic")
    n_cold = len(ends.events)
    ends.events.clear()
    second = g.map({"topic": ["ab", "abcdef"], "target": 9}, map_over="topic")
    assert [r["final"] for r in second] == [r["final"] for r in first]
    function_nodes = [e for e in ends.events if e.node_id != "good_enough"]
    assert len(ends.events) == n_cold and all(e.cached for e in function_nodes)


def test_corrupt_entries_are_recomputed(engine, store, tmp_path, logs):
    cache_dir = tmp_path / "c"
    g = Graph(G.COUNTED, engine=engine, cache=store(cache_dir))
    inputs = {"x": [1, 2, 3], "log_dir": str(logs)}
    g.map(inputs, map_over="x")
    if store is DiskCache:
        con = sqlite3.connect(cache_dir / "hn-cache.db")
        con.execute("UPDATE hn_segments SET data = X'00112233'")
        con.commit()
        con.close()
    else:
        for segment in cache_dir.rglob("*.seg"):
            segment.write_bytes(b"\x00\x11\x22\x33")
    res = g.map(inputs, map_over="x")
    assert [r["counted_plus"] for r in res] == [4, 7, 10]
    assert G.executions(logs) == [1, 1, 2, 2, 3, 3]
    again = g.map(inputs, map_over="x")  # the recomputed entries were written back
    assert [r["counted_plus"] for r in again] == [4, 7, 10]
    assert G.executions(logs) == [1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("graph, inputs", [
    (G.BRANCH, [{"data": {"valid": True, "v": 1}}, {"data": {"v": 2}}]),
    (G.DEFAULTS, [{"x": 3}, {"x": -3}]),
    (G.ROUTE, [{"kind": "u", "text": "Ab"}, {"kind": "z", "text": "Ab"}]),
    (G.MIXED, [{"x": 1}, {"x": 2}]),
    (G.CYCLE, [{"topic": "ab", "target": 6}]),
])
def test_run_and_map_compute_the_same_keys(engine, store, tmp_path, graph, inputs):
    """run() uses the reactive scheduler, map() the batch executor: same keys, full hits."""
    cache = store(tmp_path / "c")
    for item in inputs:
        Graph(graph, cache=cache).run(item)
    ends = Ends()
    mapped = {k: [item[k] for item in inputs] for k in inputs[0]}
    map_over = [k for k in inputs[0] if len({repr(i[k]) for i in inputs}) > 1] or list(inputs[0])
    broadcast = {k: inputs[0][k] for k in inputs[0] if k not in map_over}
    res = Graph(graph, engine=engine, cache=cache, callbacks=[ends]).map(
        {**{k: mapped[k] for k in map_over}, **broadcast}, map_over=map_over)
    cacheable = [e for e in ends.events if e.node_id not in ("noisy",) and e.node_id in {
        n.name for n in graph if n.cache}]
    assert cacheable and all(e.cached for e in cacheable)
    for item, r in zip(inputs, res):
        assert dict(Graph(graph).run(item)) == dict(r)
    # and the other way round: a fresh cache filled by map, read by run()
    cache2 = store(tmp_path / "c2")
    Graph(graph, engine=engine, cache=cache2).map(
        {**{k: mapped[k] for k in map_over}, **broadcast}, map_over=map_over)
    for item in inputs:
        r = Graph(graph, cache=cache2).run(item)
        assert all(h.cached for h in r.history if graph_node(graph, h.node_id).cache)


def graph_node(nodes, name):
    return next(n for n in nodes if n.name == name)


def test_async_plan_is_cached_and_warm_rerun_is_all_hits(engine, store, tmp_path):
    """Async plans take the item-flow path: their calls reach the cache like sync ones."""
    cache = store(tmp_path / "c")
    inputs = {"x": list(range(30))}
    cold = Graph(G.ASYNC, engine=engine, cache=cache).map(inputs, map_over="x")
    ends = Ends()
    warm = Graph(G.ASYNC, engine=engine, cache=cache, callbacks=[ends]).map(inputs, map_over="x")
    assert [r["total"] for r in warm] == [r["total"] for r in cold] == [x * 11 + 1 for x in range(30)]
    assert len(ends.events) == 90 and all(e.cached for e in ends.events)


@node(output_name="blob")
def blob(x: int, log_dir: str) -> str:
    """6 KB per item, distinct; one log line per execution (counted across processes)."""
    with open(Path(log_dir) / f"blob-{os.getpid()}.log", "a") as fh:
        fh.write(f"{x}\n")
    return f"{x:06d}" * 1000


def stored_bytes(store, path: Path) -> int:
    """The bytes of the segments a cache holds, read from the store itself."""
    if store is DiskCache:
        try:
            con = sqlite3.connect(path / "hn-cache.db", timeout=60)
            try:
                return con.execute("SELECT nbytes FROM hn_total").fetchone()[0]
            finally:
                con.close()
        except sqlite3.OperationalError:  # not created yet
            return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            if name.endswith((".seg", ".idx")):
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:  # evicted meanwhile
                    pass
    return total


class Sampler(threading.Thread):
    """Reads the store's size every few milliseconds while a map runs."""

    def __init__(self, store, path: Path) -> None:
        super().__init__(daemon=True)
        self.store, self.path = store, path
        self.peak = 0
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.005):
            self.peak = max(self.peak, stored_bytes(self.store, self.path))
            self.samples += 1

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()


def test_eviction_keeps_the_cache_under_its_limit_during_a_map(engine, store, tmp_path, logs):
    """120 results of 6 KB into a 128 KB cache: the store never holds more than the limit
    while the map writes (from every worker), and a rerun recomputes what was evicted, with
    the right values."""
    limit = 128 * 1024
    path = tmp_path / "c"
    cache = store(path, size_limit=limit)
    xs = list(range(120))
    expect = [f"{x:06d}" * 1000 for x in xs]
    g = Graph([blob], engine=engine, cache=cache)
    with Sampler(store, path) as sampler:
        first = g.map({"x": xs, "log_dir": str(logs)}, map_over="x")
    assert [r["blob"] for r in first] == expect
    assert sampler.samples > 0 and 0 < sampler.peak <= limit
    assert stored_bytes(store, path) <= limit
    assert G.executions(logs, "blob-") == xs
    kept = cache.stats()["entries"]
    assert 0 < kept < len(xs)  # some entries were evicted
    with Sampler(store, path) as sampler:
        again = g.map({"x": xs, "log_dir": str(logs)}, map_over="x")
    assert [r["blob"] for r in again] == expect  # evicted entries recomputed, never wrong
    assert sampler.peak <= limit
    runs = G.executions(logs, "blob-")
    assert len(runs) >= 2 * len(xs) - kept  # everything that was not kept ran again
