"""``@resource`` on the local engine: graph building, inputs, keys, build failures, the
per-process registry (one build for concurrent first calls, sync and async mixes)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import cloudpickle
import pytest

from hypernodes_bench.llm_server import label_of
from hypernodes_dist import DiskCache, Graph, node, resource
from hypernodes_dist.errors import GraphBuildError, GraphInputError, ResourceError
from hypernodes_dist.resources import release_resources
from hypernodes_dist.resources.bind import bind_resources
from hypernodes_dist.resources.registry import REGISTRY
from tests.conformance import resource_graphs as R

BUILDS: list[str] = []


@resource
def counter():
    BUILDS.append("counter")
    box = {"n": 0, "lock": threading.Lock()}
    yield box
    BUILDS.append("counter-teardown")


@resource(name="prefix", version="1")
def make_prefix(word: str = "hi"):
    BUILDS.append(f"prefix:{word}")
    return word + ":"


@resource
async def aclient(prefix):
    await asyncio.sleep(0)
    BUILDS.append("aclient")
    return {"loop": asyncio.get_running_loop(), "prefix": prefix}


@node(output_name="out")
def greet(name: str, prefix, counter) -> str:
    with counter["lock"]:
        counter["n"] += 1
    return prefix + name


@node(output_name="where")
def sync_uses_async(name: str, aclient) -> str:
    return aclient["prefix"] + name


@pytest.fixture(autouse=True)
def fresh_registry():
    release_resources()
    BUILDS.clear()
    yield
    release_resources()


def test_a_resource_is_not_an_input_and_may_read_broadcast_inputs():
    graph = Graph([counter, make_prefix, greet])
    assert graph.inputs == ("name", "word")
    assert graph.required_inputs == ("name",)
    with pytest.raises(GraphInputError, match="'counter'.*resource"):
        graph.run({"name": "a", "counter": object()})
    res = graph.map({"name": ["a", "b", "c"], "word": "yo"}, map_over="name")
    assert [r["out"] for r in res] == ["yo:a", "yo:b", "yo:c"]
    assert sorted(BUILDS) == ["counter", "prefix:yo"]  # once each, for the whole map


def test_one_build_per_distinct_inputs_and_teardown_on_close():
    graph = Graph([counter, make_prefix, greet])
    assert graph.run({"name": "a"})["out"] == "hi:a"
    assert graph.run({"name": "a", "word": "yo"})["out"] == "yo:a"
    assert graph.run({"name": "b"})["out"] == "hi:b"
    assert BUILDS.count("prefix:hi") == 1 and BUILDS.count("prefix:yo") == 1
    assert BUILDS.count("counter") == 1
    graph.engine.close()
    assert BUILDS[-1] == "counter-teardown"


def test_calls_reuse_the_built_resources_until_a_close_and_a_called_node_still_ships():
    graph = Graph([counter, make_prefix, greet])
    assert graph.run({"name": "a"})["out"] == "hi:a"
    assert graph.run({"name": "b", "word": "yo"})["out"] == "yo:b"  # other inputs: another
    assert graph.run({"name": "c"})["out"] == "hi:c"
    graph.engine.close()
    assert graph.run({"name": "d"})["out"] == "hi:d"  # built again after the close
    assert BUILDS.count("prefix:hi") == 2 and BUILDS.count("counter") == 2
    [bound] = bind_resources([greet], {"counter": counter, "prefix": make_prefix})
    assert bound.func(name="e", word="hi") == "hi:e"
    shipped = cloudpickle.loads(cloudpickle.dumps(bound))  # without the counter's lock
    assert shipped.func(name="f", word="hi") == "hi:f"


@resource
def shouter():
    return str.upper


@node(output_name="loud", batch_api=True)
async def shout_async(word: str, shouter) -> str:
    return shouter(word)


@node(output_name="loud", batch_api=True)
def shout_sync(word: str, shouter) -> str:
    return shouter(word)


@pytest.mark.parametrize("shout", [shout_async, shout_sync], ids=["async", "sync"])
def test_a_bound_batch_api_node_ships_to_worker_processes(shout):
    """Dask processes/distributed and Daft pickle the bound node (by value: its call is a
    closure); its call must close over nothing that does not pickle (a ContextVar)."""
    [bound] = bind_resources([shout], {"shouter": shouter})
    shipped = cloudpickle.loads(cloudpickle.dumps(bound))
    value = shipped.func(word="hey")
    assert (asyncio.run(value) if asyncio.iscoroutine(value) else value) == "HEY"


def test_invalid_resource_graphs_are_rejected_at_build():
    @resource
    def a(b):
        return 1

    @resource
    def b(a):
        return 2

    @node(output_name="y")
    def uses(a) -> int:
        return a

    with pytest.raises(GraphBuildError, match="cycle"):
        Graph([a, b, uses])

    @resource(name="out")
    def clashing():
        return 0

    with pytest.raises(GraphBuildError, match="'out'.*output of node 'greet'"):
        Graph([clashing, greet, counter, make_prefix])
    with pytest.raises(GraphBuildError, match="two resources"):
        Graph([counter, counter, make_prefix, greet])


def test_the_resource_identity_is_in_the_cache_key(tmp_path):
    cache = DiskCache(tmp_path / "c")
    first = Graph([counter, make_prefix, greet], cache=cache)
    first.map({"name": ["a", "b"]}, map_over="name")

    @resource(name="prefix", version="2")
    def make_prefix_v2(word: str = "hi"):
        return word + "!"

    again = Graph([counter, make_prefix, greet], cache=cache).map({"name": ["a", "b"]},
                                                                   map_over="name")
    assert all(r.history[-1].cached for r in again)
    changed = Graph([counter, make_prefix_v2, greet], cache=cache).map({"name": ["a", "b"]},
                                                                       map_over="name")
    assert [r["out"] for r in changed] == ["hi!a", "hi!b"]  # recomputed, never mixed
    assert not any(r.history[-1].cached for r in changed)


def test_not_in_key_must_name_parameters():
    with pytest.raises(ValueError, match="resource 'client': not_in_key names 'base_ulr', "
                                         "which is not one of its parameters"):
        @resource(not_in_key=("base_ulr",))
        def client(base_url: str):
            return base_url


@resource(not_in_key="key")
def keyed(key: str = "k1", word: str = "hi"):
    return word + ":"


@node(output_name="out")
def greet_keyed(name: str, keyed) -> str:
    return keyed + name


@node(output_name="seen")
def reads_key(key: str) -> str:
    return key


def test_only_inputs_every_reader_leaves_out_stay_out_of_keys(tmp_path):
    cache = DiskCache(tmp_path / "c")
    graph = Graph([keyed, greet_keyed], cache=cache)
    assert graph.plan.unkeyed == {"key"}
    graph.map({"name": ["a", "b"], "key": "k1"}, map_over="name")
    again = graph.map({"name": ["a", "b"], "key": "k2"}, map_over="name")
    assert all(r.history[-1].cached for r in again)
    changed = graph.map({"name": ["a", "b"], "key": "k2", "word": "yo"}, map_over="name")
    assert [r["out"] for r in changed] == ["yo:a", "yo:b"]  # other inputs still count
    both = Graph([keyed, greet_keyed, reads_key], cache=cache)  # a node reads it itself
    assert both.plan.unkeyed == set()
    inner = Graph([keyed, greet_keyed], name="inner").as_node(inputs={"api_key": "key"})
    assert Graph([inner]).plan.unkeyed == {"api_key"}  # a nested graph's, renamed


def test_a_failed_build_fails_every_item_with_resource_error():
    @resource
    def broken():
        raise OSError("no model file")

    @node(output_name="y")
    def uses(x: int, broken) -> int:
        return x

    res = Graph([broken, uses]).map({"x": [1, 2, 3]}, map_over="x", on_error="collect")
    assert len(res.errors) == 3
    for r in res:
        assert isinstance(r.error, ResourceError)
        assert "'broken'" in str(r.error) and r.error.worker in str(r.error)
        assert isinstance(r.error.__cause__, OSError)
    with pytest.raises(ResourceError, match="building resource 'broken' failed"):
        Graph([broken, uses]).run({"x": 1})


def test_a_sync_node_takes_an_async_resource_built_on_the_process_loop():
    graph = Graph([make_prefix, aclient, sync_uses_async])
    assert graph.run({"name": "a"})["where"] == "hi:a"
    res = graph.map({"name": ["b", "c"]}, map_over="name")
    assert [r["where"] for r in res] == ["hi:b", "hi:c"]
    assert BUILDS.count("aclient") == 1


def test_concurrent_first_calls_from_threads_build_once():
    graph = Graph([counter, make_prefix, greet])
    barrier = threading.Barrier(8)
    outs: list[str] = []

    def worker(i: int) -> None:
        barrier.wait()
        outs.append(graph.run({"name": str(i)})["out"])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outs) == sorted(f"hi:{i}" for i in range(8))
    assert BUILDS.count("counter") == 1 and len(REGISTRY.entries) == 2


def test_the_notebook_case_one_loop_for_maps_inside_a_running_loop_then_arun(llm_server):
    """Jupyter: ``map()`` twice while a loop runs, then ``await arun()``; a module-level
    client (bound to the loop of its first use) works in all three."""
    graph = Graph([R.classify_global])
    texts = ["a b", "c", "d e f"]

    async def notebook():
        inputs = {"text": texts, "base_url": llm_server.base_url}
        first = graph.map(inputs, map_over="text")
        second = graph.map(inputs, map_over="text")
        last = await graph.arun({"text": "g h", "base_url": llm_server.base_url})
        return first, second, last

    first, second, last = asyncio.run(notebook())
    want = [label_of(t) for t in texts]
    assert [r["label"] for r in first] == want == [r["label"] for r in second]
    assert last["label"] == label_of("g h")


SCRIPT = '''
import openai
from hypernodes_dist import Graph, node
from hypernodes_dist.engines import DaskEngine

client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x")

@node(output_name="label")
async def classify(text: str) -> str:
    r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content

if __name__ == "__main__":
    Graph([classify], engine=DaskEngine(scheduler="processes", num_workers=1)).map(
        {"text": ["a"]}, map_over="text")
'''


def test_a_script_global_that_cannot_be_shipped_is_named_before_anything_runs(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("hypernodes_dist.errors.UnpicklableError")
    assert "'classify' reads 'client' (AsyncOpenAI)" in last and "@resource" in last
