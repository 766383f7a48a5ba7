"""Unpicklable nodes, closures over locks, and inputs that cannot be hashed canonically.

Shipping: on Dask processes / distributed and on Daft, a node or an input that cannot be
pickled fails with an error naming the node or the parameter (and the item for a mapped
value) BEFORE any work is submitted: a first node that logs each call never ran.
Daft's native runner runs UDFs in threads of the driver, so mapped values are not pickled
there: an unpicklable *mapped* value is simply passed through (documented fallback).

Hashing for the cache: a value with no canonical hash that also cannot be pickled raises
``UnhashableValueError`` (a ``TypeError``). The documented fallback is
``__hypernodes_hash__``, which makes such a value cacheable.
"""

from __future__ import annotations

import threading

import pytest

from hypernodes_dist import DiskCache, Graph, node
from hypernodes_dist.cache.hashing import UnhashableValueError
from hypernodes_dist.engines import DaftEngine, DaskEngine

from . import graphs as R


def _closure_node():
    lock = threading.Lock()

    @node(output_name="z")
    def guarded(y: int) -> int:
        with lock:
            return y

    return guarded


@pytest.fixture(scope="module")
def shippers():
    engines = {
        "dask-processes": DaskEngine(scheduler="processes", num_workers=2, partition_size=2),
        "dask-distributed": DaskEngine(scheduler="distributed", num_workers=2, partition_size=2,
                                       cluster_kwargs={"threads_per_worker": 1}),
        "daft": DaftEngine(batch_size=2),
    }
    yield engines
    for e in engines.values():
        e.close()


ENGINES = ["dask-processes", "dask-distributed", "daft"]


@pytest.mark.parametrize("name", ENGINES)
def test_closure_over_a_lock_is_named_before_any_work(shippers, name, tmp_path):
    g = Graph([R.logged_inc, _closure_node()], engine=shippers[name])
    with pytest.raises(TypeError, match=r"node 'guarded'.*(pickle|serializable)"):
        g.map({"x": list(range(6)), "log_dir": str(tmp_path)}, map_over="x")
    assert list(tmp_path.iterdir()) == []  # nothing ran


@pytest.mark.parametrize("name", ENGINES)
def test_unpicklable_broadcast_input_is_named_before_any_work(shippers, name, tmp_path):
    g = Graph([R.logged_inc, R.echo], engine=shippers[name])
    with pytest.raises(TypeError, match=r"input 'handle'"):
        g.map({"x": list(range(6)), "log_dir": str(tmp_path), "handle": R.Handle()},
              map_over="x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["dask-processes", "dask-distributed"])
def test_unpicklable_mapped_value_names_input_and_item(shippers, name, tmp_path):
    g = Graph([R.logged_inc, R.echo], engine=shippers[name])
    handles = [1, 2, 3, R.Handle(), 5, 6]
    with pytest.raises(TypeError, match=r"input 'handle' \(item 3\)"):
        g.map({"x": list(range(6)), "log_dir": str(tmp_path), "handle": handles},
              map_over=["x", "handle"])
    assert list(tmp_path.iterdir()) == []


def test_daft_native_passes_unpicklable_mapped_values_through(shippers, tmp_path):
    g = Graph([R.logged_inc, R.echo], engine=shippers["daft"])
    handles = [1, 2, 3, R.Handle(), 5, 6]
    res = g.map({"x": list(range(6)), "log_dir": str(tmp_path), "handle": handles},
                map_over=["x", "handle"])
    assert [r["echo"] for r in res] == list(range(6))


# --------------------------------------------------------------------------- hashing


def test_hypernodes_hash_is_the_documented_fallback(tmp_path):
    g = Graph([R.echo], cache=DiskCache(tmp_path))
    for _ in range(2):
        res = g.map({"x": [1, 2], "handle": R.HashableHandle()}, map_over="x")
        assert [r["echo"] for r in res] == [1, 2]
    hits = []

    class Hits:
        def on_node_end(self, event):
            hits.append(event.cached)

    Graph([R.echo], cache=DiskCache(tmp_path), callbacks=[Hits()]).map(
        {"x": [1, 2], "handle": R.HashableHandle()}, map_over="x")
    assert hits == [True, True]


@pytest.mark.parametrize("mapped", [False, True], ids=["broadcast", "mapped"])
@pytest.mark.parametrize("engine", ["local", "dask-sync"])
def test_unhashable_input_of_a_cached_node_is_a_type_error(tmp_path, engine, mapped):
    eng = DaskEngine(scheduler="sync") if engine == "dask-sync" else None
    g = Graph([R.echo], cache=DiskCache(tmp_path), engine=eng)
    inputs = ({"x": [1, 2, 3], "handle": [1, 2, R.Handle()]} if mapped
              else {"x": [1, 2, 3], "handle": R.Handle()})
    with pytest.raises(UnhashableValueError, match="Handle"):
        g.map(inputs, map_over=["x", "handle"] if mapped else "x")


@pytest.mark.parametrize("mapped", [False, True], ids=["broadcast", "mapped"])
def test_unhashable_input_error_names_parameter_node_and_item(tmp_path, mapped):
    g = Graph([R.echo], cache=DiskCache(tmp_path))
    inputs = ({"x": [1, 2, 3], "handle": [1, 2, R.Handle()]} if mapped
              else {"x": [1, 2, 3], "handle": R.Handle()})
    with pytest.raises(UnhashableValueError) as info:
        g.map(inputs, map_over=["x", "handle"] if mapped else "x")
    text = str(info.value) + " ".join(getattr(info.value, "__notes__", []))
    assert "'handle'" in text and "echo" in text
    if mapped:
        assert "item 2" in text
