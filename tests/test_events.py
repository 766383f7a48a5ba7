"""Events: the full set, their common fields, callbacks (a raising one never breaks a run)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hypernodes_dist import DiskCache, Graph, branch, node
from hypernodes_dist.events import (
    GateDecisionEvent,
    NodeEndEvent,
    NodeSkippedEvent,
    NodeStartEvent,
    RunEndEvent,
    RunStartEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    hook_name,
)
from hypernodes_dist.execution.statesync import apply_patch, pointer, unpointer

from .conformance import edge_graphs as E


class Recorder:
    def __init__(self) -> None:
        self.events: list = []
        self.hooks: list[str] = []

    def on_event(self, event) -> None:
        self.events.append(event)

    def on_node_end(self, event) -> None:
        self.hooks.append("node_end")

    def on_run_start(self, event) -> None:
        self.hooks.append("run_start")

    def on_run_end(self, event) -> None:
        self.hooks.append("run_end")


@node(output_name="doubled", tags=["math", "x2"])
def double(x: int) -> int:
    return 2 * x


@node(output_name="result")
def add_one(doubled: int) -> int:
    return doubled + 1


def types(events) -> list[str]:
    return [type(e).__name__ for e in events]


def test_lifecycle_events_and_common_fields():
    rec = Recorder()
    g = Graph([double, add_one], callbacks=[rec])
    r = g.run({"x": 3}, session_id="sess-e")
    assert types(rec.events) == [
        "RunStartEvent", "StateSnapshotEvent",
        "NodeStartEvent", "StateDeltaEvent", "NodeEndEvent",
        "NodeStartEvent", "StateDeltaEvent", "NodeEndEvent",
        "RunEndEvent",
    ]
    assert rec.hooks == ["run_start", "node_end", "node_end", "run_end"]
    for e in rec.events:
        assert e.session_id == "sess-e" and e.run_id == r.run_id
    start = rec.events[0]
    assert isinstance(start, RunStartEvent) and start.inputs == {"x": 3} and start.graph_id
    node_events = [e for e in rec.events if isinstance(e, (NodeStartEvent, NodeEndEvent))]
    assert [(e.node_id, e.step_index) for e in node_events] == [
        ("double", 0), ("double", 0), ("add_one", 1), ("add_one", 1)]
    assert node_events[0].tags == ("math", "x2") and node_events[0].inputs == {"x": 3}
    end = [e for e in rec.events if isinstance(e, NodeEndEvent)]
    assert end[0].outputs == {"doubled": 6} and end[0].cached is False
    assert all(e.duration_ms >= 0 for e in end)
    run_end = rec.events[-1]
    assert isinstance(run_end, RunEndEvent)
    assert run_end.status == "complete" and run_end.outputs == {"doubled": 6, "result": 7}


def test_state_snapshot_plus_deltas_rebuild_the_state():
    rec = Recorder()
    Graph([double, add_one], callbacks=[rec]).run({"x": 5})
    snap = next(e for e in rec.events if isinstance(e, StateSnapshotEvent))
    state = snap.state
    for e in rec.events:
        if isinstance(e, StateDeltaEvent):
            assert all(op["op"] in ("add", "replace") for op in e.operations)
            state = apply_patch(state, e.operations)
    assert state == {"x": 5, "doubled": 10, "result": 11}
    assert snap.state == {"x": 5}  # apply_patch never mutates


def test_json_pointer_escaping():
    assert pointer("a/b~c") == "/a~1b~0c"
    assert unpointer(pointer("a/b~c")) == "a/b~c"
    assert apply_patch({"a": 1}, [{"op": "remove", "path": "/a"}]) == {}


def test_cached_node_end_event(tmp_path):
    calls = []

    @node(output_name="y")
    def slow(x: int) -> int:
        calls.append(x)
        return x + 1

    rec = Recorder()
    g = Graph([slow], cache=DiskCache(str(tmp_path / "c")), callbacks=[rec])
    g.run({"x": 1})
    rec.events.clear()
    assert g.run({"x": 1})["y"] == 2
    assert calls == [1]
    ends = [e for e in rec.events if isinstance(e, NodeEndEvent)]
    assert len(ends) == 1 and ends[0].cached is True and ends[0].outputs == {"y": 2}


def test_gate_decision_and_skipped_events():
    @branch(when_true="big", when_false="small")
    def is_big(x: int) -> bool:
        return x > 10

    @node(output_name="label", tags=["t"])
    def big(x: int) -> str:
        return "big"

    @node(output_name="label")
    def small(x: int) -> str:
        return "small"

    rec = Recorder()
    r = Graph([is_big, big, small], callbacks=[rec]).run({"x": 1})
    assert r["label"] == "small"
    gate = next(e for e in rec.events if isinstance(e, GateDecisionEvent))
    assert gate.gate_id == "is_big" and gate.decision is False
    assert gate.activated_targets == ("small",)
    skipped = [e for e in rec.events if isinstance(e, NodeSkippedEvent)]
    assert [(e.node_id, e.skipped_by, e.tags) for e in skipped] == [("big", "is_big", ("t",))]
    assert "is_big" in skipped[0].reason


def test_raising_callback_is_logged_and_never_breaks_the_run(caplog):
    class Broken:
        def on_node_end(self, event):
            raise RuntimeError("callback bug")

        def on_run_start(self, event):
            raise KeyError("boom")

    rec = Recorder()
    g = Graph([double, add_one], callbacks=[Broken(), rec])
    with caplog.at_level(logging.WARNING, logger="hypernodes_dist.events"):
        r = g.run({"x": 1})
    assert r["result"] == 3 and r.status == "complete"
    assert types(rec.events)[-1] == "RunEndEvent"  # later callbacks still get everything
    assert any("Broken.on_node_end" in m for m in caplog.messages)


def test_raising_callback_in_iter_and_async_run():
    class Broken:
        def on_event(self, event):
            raise ValueError("nope")

    g = Graph([double, add_one], callbacks=[Broken()])

    async def go():
        seen = []
        async with g.iter(inputs={"x": 2}) as run:
            async for e in run:
                seen.append(type(e).__name__)
        return seen, run.result, await g.arun({"x": 2})

    seen, result, aresult = asyncio.run(go())
    assert seen[0] == "RunStartEvent" and seen[-1] == "RunEndEvent"
    assert result["result"] == 5 and aresult["result"] == 5


def test_hook_names():
    assert hook_name(NodeEndEvent) == "on_node_end"
    assert hook_name(StateDeltaEvent) == "on_state_delta"
    assert hook_name(GateDecisionEvent) == "on_gate_decision"


@pytest.mark.parametrize("use_iter", [False, True])
def test_callbacks_see_the_same_events_in_run_and_iter(use_iter):
    rec = Recorder()
    g = Graph([double, add_one], callbacks=[rec])
    if use_iter:
        async def go():
            async with g.iter(inputs={"x": 1}) as run:
                return [type(e).__name__ async for e in run]
        yielded = asyncio.run(go())
        assert yielded == types(rec.events)
    else:
        g.run({"x": 1})
    assert types(rec.events)[0] == "RunStartEvent" and types(rec.events)[-1] == "RunEndEvent"
    assert len(rec.events) == 9


# ------------------------------------------------------------------ cache hits


def _node_kinds(rec: Recorder, node_id: str) -> list[str]:
    return [type(e).__name__ for e in rec.events
            if getattr(e, "node_id", None) == node_id and "Node" in type(e).__name__]


def test_a_cache_hit_reports_only_its_end_in_run(tmp_path):
    rec = Recorder()
    graph = Graph(E.TIMED, cache=DiskCache(tmp_path / "c"), callbacks=[rec])
    graph.run({"x": 1})
    assert _node_kinds(rec, "slow") == ["NodeStartEvent", "NodeEndEvent"]
    rec.events.clear()
    again = graph.run({"x": 1})
    assert _node_kinds(rec, "slow") == ["NodeEndEvent"]
    assert all(e.cached for e in rec.events if type(e).__name__ == "NodeEndEvent")
    assert [h.cached for h in again.history] == [True, True]
