"""Edge cases of one run (engine-independent): gates and END, empty streams, loops that END,
cache-hit events, interrupts inside nested graphs, and the ``Graph.map`` docstring."""

from __future__ import annotations

import inspect
import re
from collections.abc import AsyncIterator, Iterator
from typing import Literal

import pytest

from hypernodes_dist import DiskCache, Graph, GraphEngine, gate, node
from hypernodes_dist.errors import GateDecisionError, UnknownTargetError

from .conformance import edge_graphs as E


class Events:
    def __init__(self) -> None:
        self.events: list = []

    def on_event(self, event) -> None:
        self.events.append(event)

    def kinds(self, node_id: str) -> list[str]:
        return [type(e).__name__ for e in self.events
                if getattr(e, "node_id", None) == node_id and "Node" in type(e).__name__]


# ------------------------------------------------------------------ gates


def test_undeclared_end_raises_naming_the_gate_and_its_targets():
    with pytest.raises(GateDecisionError, match=r"gate 'only_go' returned END.*'go'.*Literal"):
        Graph(E.UNDECLARED_END).run({"x": 2})
    assert Graph(E.UNDECLARED_END).run({"x": 1})["went"] == 1


def test_the_string_END_in_a_literal_points_to_the_END_constant():
    @gate
    def decide(x: int) -> Literal["go", "END"]:
        return "go"

    with pytest.raises(UnknownTargetError, match=r"'END'.*END constant.*from hypernodes_dist import END"):
        Graph([decide, E.go])


# ------------------------------------------------------------------ streams


def test_empty_streams_are_empty_of_their_kind():
    res = Graph(E.STREAMS).run({"k": 0})
    assert res["numbers"] == [] and res["text"] == "" and res["sizes"] == (0, 0)

    @node(output_name="chunks")
    def typed(k: int) -> Iterator[bytes]:
        yield from (b"x" for _ in range(k))

    @node(output_name="parts")
    async def merged(k: int) -> AsyncIterator[dict]:
        for i in range(k):
            yield {i: i}

    out = Graph([typed, merged]).run({"k": 0})
    assert out["chunks"] == b"" and out["parts"] == {}
    assert Graph([typed, merged]).map({"k": [0, 1]}, map_over="k").column("parts") == [{}, {0: 0}]


# ------------------------------------------------------------------ loops that END


@pytest.mark.parametrize("nodes", [E.LOOP_INCREMENT, E.LOOP_BUMP], ids=["increment", "bump"])
@pytest.mark.parametrize("parallel", [False, True])
def test_loop_outputs_are_consistent_when_the_gate_ends(nodes, parallel):
    res = Graph(nodes, engine=GraphEngine(parallel_nodes=parallel)).run({"seed": 0})
    assert res["count"] == 3 and res["t"] == "t3"
    order = [h.node_id for h in res.history]
    assert order[-1] in ("check", "check_bump")  # the gate decides last, on settled values
    assert order.count("transform") == 4  # on every value of count: 0, 1, 2, 3


# ------------------------------------------------------------------ cache hits


def test_a_cache_hit_reports_only_its_end_in_run(tmp_path):
    rec = Events()
    graph = Graph(E.TIMED, cache=DiskCache(tmp_path / "c"), callbacks=[rec])
    graph.run({"x": 1})
    assert rec.kinds("slow") == ["NodeStartEvent", "NodeEndEvent"]
    rec.events.clear()
    again = graph.run({"x": 1})
    assert rec.kinds("slow") == ["NodeEndEvent"]
    assert all(e.cached for e in rec.events if type(e).__name__ == "NodeEndEvent")
    assert [h.cached for h in again.history] == [True, True]


# ------------------------------------------------------------------ Graph.map docstring


def test_map_docstring_documents_every_parameter():
    doc = inspect.getdoc(Graph.map)
    params = [p for p in inspect.signature(Graph.map).parameters if p != "self"]
    missing = [p for p in params if not re.search(rf"``{p}``|\b{p}\b:", doc)]
    assert missing == []
