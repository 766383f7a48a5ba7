"""DaftEngine specifics; the shared behaviours are in tests/conformance (engine ids daft*)."""

from __future__ import annotations

import threading

import pytest

from hypernodes_daft import DaftEngine
from hypernodes_daft.frame import item_frame
from hypernodes_daft.udf import consecutive_runs
from hypernodes_dist import DiskCache, Graph, GraphEngine, node
from hypernodes_dist.engines import get_engine
from tests.conformance import graphs as G


def test_entry_point_and_arguments():
    assert get_engine("daft") is DaftEngine
    with pytest.raises(ValueError, match="runner"):
        DaftEngine(runner="spark")
    with pytest.raises(ValueError, match="batch_size"):
        DaftEngine(batch_size=0)


def test_runs_of_consecutive_row_ids():
    assert consecutive_runs([4, 5, 6]) == [(0, 3)]
    assert consecutive_runs([4, 5, 9, 10, 2]) == [(0, 2), (2, 4), (4, 5)]
    assert consecutive_runs([7]) == [(0, 1)]


def test_frame_keeps_python_values_exact():
    cols = {
        "ints": [1, None, 3],
        "mixed": [1, True, 1.0],
        "tuples": [(1,), (2,), ()],
        "big": [2**70, 1, 2],
        "dicts": [{"b": 1, "a": 2}, {}, {"x": None}],
    }
    back = item_frame(cols, 3).to_pydict()
    for i, (name, values) in enumerate(cols.items()):
        got = back[f"__hn_in{i}"]
        assert got == values and [type(v) for v in got] == [type(v) for v in values], name


@node(output_name="kind")
def kind(v) -> str:
    return f"{type(v).__name__}:{v!r}"


def test_results_and_types_match_the_local_engine(daft_engine):
    values = [1, True, 1.0, "1", (1,), [1], None, 2**70, {"a": {1, 2}}, b"x"]
    expected = Graph([kind]).map({"v": values}, map_over="v")
    got = Graph([kind], engine=daft_engine).map({"v": values}, map_over="v")
    assert [r["kind"] for r in got] == [r["kind"] for r in expected]


def test_shared_cache_same_keys_as_local_and_cached_events(tmp_path, daft_engine):
    ends = []

    class Collect:
        def on_node_end(self, event):
            ends.append(event)

    cache = DiskCache(tmp_path / "c")
    xs = list(range(10))
    Graph(G.CHAIN, engine=GraphEngine(), cache=cache).map({"x": xs}, map_over="x")
    res = Graph(G.CHAIN, engine=daft_engine, cache=cache, callbacks=[Collect()]).map(
        {"x": xs}, map_over="x"
    )
    assert [r["c"] for r in res] == [G.chain_expected(x)["c"] for x in xs]
    assert len(ends) == 30 and all(e.cached for e in ends)
    assert all(h.cached for r in res for h in r.history)


def test_unserializable_node_is_named_before_running(daft_engine):
    lock = threading.Lock()
    ran = []

    @node(output_name="y")
    def locked(x: int) -> int:
        ran.append(x)
        with lock:
            return x

    with pytest.raises(TypeError, match="locked"):
        Graph([locked], engine=daft_engine).map({"x": [1, 2]}, map_over="x")
    assert ran == []


def test_iter_raises_type_error_naming_the_engine(daft_engine):
    with pytest.raises(TypeError, match="DaftEngine"):
        Graph(G.CHAIN, engine=daft_engine).iter({"x": 1})


def test_many_batches_stream_into_item_order(daft_engine):
    xs = list(range(103))
    res = Graph(G.CHAIN, engine=daft_engine).map({"x": xs, "y": "q"}, map_over="x")
    assert [r["c"] for r in res] == [G.chain_expected(x, "q")["c"] for x in xs]
    assert [r.run_id.rsplit("-", 1)[1] for r in res] == [str(i) for i in range(103)]


def test_error_stops_with_original_exception(daft_engine):
    g = Graph(G.FRAGILE, engine=daft_engine)
    with pytest.raises(G.ItemFailure) as info:
        g.map({"x": list(range(50)), "bad": (33,)}, map_over="x")
    assert info.value.hn_node == "fragile" and info.value.hn_item == 33
    ok = g.map({"x": [1, 2]}, map_over="x")  # the engine is still usable afterwards
    assert [r.status for r in ok] == ["complete", "complete"]


def test_other_runner_in_same_process_is_refused(daft_engine):
    Graph(G.CHAIN, engine=daft_engine).map({"x": [1]}, map_over="x")  # locks in "native"
    with pytest.raises(RuntimeError, match="native"):
        Graph(G.CHAIN, engine=DaftEngine(runner="ray")).map({"x": [1]}, map_over="x")
