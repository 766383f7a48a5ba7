"""GraphEngine(parallel_nodes=True, max_workers=N): independent nodes run concurrently
(threads for sync, tasks for async), sharing a step_index with distinct parallel_index;
run() and arun() share one execution path."""

from __future__ import annotations

import asyncio
import threading

import pytest

from hypernodes_dist import Graph, GraphEngine, node
from hypernodes_dist.events import NodeEndEvent, NodeStartEvent


class Recorder:
    def __init__(self) -> None:
        self.events: list = []

    def on_event(self, event) -> None:
        self.events.append(event)


def _sync_fan_out(barrier: threading.Barrier | None, threads: set[str]):
    def work(tag: str, x: int) -> str:
        threads.add(threading.current_thread().name)
        if barrier is not None:
            barrier.wait()  # passes only if both branches run at the same time
        return f"{tag}{x}"

    @node(output_name="a")
    def left(x: int) -> str:
        return work("L", x)

    @node(output_name="b")
    def right(x: int) -> str:
        return work("R", x)

    @node(output_name="out")
    def join(a: str, b: str) -> str:
        return a + b

    return [left, right, join]


def test_sync_nodes_run_concurrently_in_threads_with_one_step_index():
    threads: set[str] = set()
    rec = Recorder()
    g = Graph(_sync_fan_out(threading.Barrier(2, timeout=60), threads),
              engine=GraphEngine(parallel_nodes=True, max_workers=2), callbacks=[rec])
    r = g.run({"x": 1})
    assert r["out"] == "L1R1"
    assert len(threads) == 2 and all(t.startswith("hn-node") for t in threads)
    h = {e.node_id: e for e in r.history}
    assert h["left"].step_index == h["right"].step_index == 0
    assert {h["left"].parallel_index, h["right"].parallel_index} == {0, 1}
    assert h["join"].step_index == 1 and h["join"].parallel_index == 0
    starts = {e.node_id: e for e in rec.events if isinstance(e, NodeStartEvent)}
    assert starts["left"].step_index == starts["right"].step_index
    assert {starts["left"].parallel_index, starts["right"].parallel_index} == {0, 1}


def test_max_workers_one_serialises_sync_nodes():
    threads: set[str] = set()
    g = Graph(_sync_fan_out(None, threads), engine=GraphEngine(parallel_nodes=True,
                                                               max_workers=1))
    assert g.run({"x": 2})["out"] == "L2R2" and len(threads) == 1


def test_sequential_engine_gives_distinct_steps():
    g = Graph(_sync_fan_out(None, set()))
    steps = [(h.node_id, h.step_index, h.parallel_index) for h in g.run({"x": 1}).history]
    assert steps == [("left", 0, 0), ("right", 1, 0), ("join", 2, 0)]


def test_async_nodes_run_as_concurrent_tasks():
    state = {"running": 0, "peak": 0}

    def make(name: str):
        @node(output_name=name, name=f"fetch_{name}")
        async def fetch(x: int) -> int:
            state["running"] += 1
            state["peak"] = max(state["peak"], state["running"])
            await asyncio.sleep(0.02)
            state["running"] -= 1
            return x

        return fetch

    @node(output_name="total")
    def total(a: int, b: int, c: int) -> int:
        return a + b + c

    nodes = [make("a"), make("b"), make("c"), total]
    g = Graph(nodes, engine=GraphEngine(parallel_nodes=True, max_workers=4))
    r = g.run({"x": 2})
    assert r["total"] == 6 and state["peak"] == 3
    fetches = [h for h in r.history if h.node_id.startswith("fetch")]
    assert {h.step_index for h in fetches} == {0}
    assert sorted(h.parallel_index for h in fetches) == [0, 1, 2]
    state["peak"] = 0
    assert Graph(nodes).run({"x": 2})["total"] == 6 and state["peak"] == 1


def test_failure_in_a_parallel_wave_raises_the_original_error():
    @node(output_name="a")
    def ok(x: int) -> int:
        return x

    @node(output_name="b")
    def boom(x: int) -> int:
        raise KeyError("bad key")

    @node(output_name="c")
    def join(a: int, b: int) -> int:
        return a + b

    g = Graph([ok, boom, join], engine=GraphEngine(parallel_nodes=True))
    with pytest.raises(KeyError) as info:
        g.run({"x": 1})
    assert "boom" in str(info.value) + " ".join(getattr(info.value, "__notes__", []))
    r = g.run({"x": 1}, on_error="collect")
    assert r.status == "error" and isinstance(r.error, KeyError) and r["a"] == 1


@pytest.mark.parametrize("parallel", [False, True])
def test_run_and_arun_give_the_same_result_and_events(parallel):
    rec_sync, rec_async = Recorder(), Recorder()
    nodes = _sync_fan_out(None, set())
    engine = GraphEngine(parallel_nodes=parallel, max_workers=2)
    r1 = Graph(nodes, engine=engine, callbacks=[rec_sync]).run({"x": 3})
    r2 = asyncio.run(Graph(nodes, engine=engine, callbacks=[rec_async]).arun({"x": 3}))
    assert dict(r1) == dict(r2) == {"a": "L3", "b": "R3", "out": "L3R3"}
    key = lambda h: (h.node_id, h.step_index, h.parallel_index)  # noqa: E731
    assert sorted(map(key, r1.history)) == sorted(map(key, r2.history))
    kinds = lambda rec: sorted(type(e).__name__ for e in rec.events)  # noqa: E731
    assert kinds(rec_sync) == kinds(rec_async)
    ends = [e for e in rec_sync.events if isinstance(e, NodeEndEvent)]
    assert len(ends) == 3


def test_run_is_a_thin_wrapper_over_arun():
    import inspect

    from hypernodes_dist.graph import Graph as G

    src = inspect.getsource(G.run)
    assert "self.arun(" in src and "Scheduler" not in src
