"""Semantics the contract leaves open (README), the same on every engine: gates and
``END``, loops that end, empty streams, duplicate items with and without a cache, cache-hit
events, a nested interrupt in a map."""

from __future__ import annotations

import pytest

from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.errors import GateDecisionError

from . import edge_graphs as E


class Events:
    def __init__(self) -> None:
        self.starts: list = []
        self.ends: list = []

    def on_node_start(self, event) -> None:
        self.starts.append(event)

    def on_node_end(self, event) -> None:
        self.ends.append(event)


# ------------------------------------------------------------------ gates and END


def test_undeclared_end_is_an_error_naming_gate_and_targets(engine):
    res = Graph(E.UNDECLARED_END, engine=engine).map(
        {"x": [1, 2, 3]}, map_over="x", on_error="collect")
    assert [r.status for r in res] == ["complete", "error", "complete"]
    assert isinstance(res[1].error, GateDecisionError)
    assert "only_go" in str(res[1].error) and "'go'" in str(res[1].error)
    assert "END" in str(res[1].error)
    assert res[0]["went"] == 1 and res[2]["went"] == 3


@pytest.mark.parametrize("nodes", [E.LOOP_INCREMENT, E.LOOP_BUMP], ids=["increment", "bump"])
def test_loop_outputs_are_consistent_when_the_gate_ends(engine, nodes):
    res = Graph(nodes, engine=engine).map({"seed": [0, 2, 5]}, map_over="seed")
    assert [r["count"] for r in res] == [3, 3, 5]
    assert [r["t"] for r in res] == ["t3", "t3", "t5"]


# ------------------------------------------------------------------ streams


def test_a_stream_that_yields_nothing_is_empty_of_its_kind(engine):
    res = Graph(E.STREAMS, engine=engine).map({"k": [0, 2]}, map_over="k")
    assert res[0]["numbers"] == [] and res[0]["text"] == "" and res[0]["sizes"] == (0, 0)
    assert res[1]["numbers"] == [0, 1] and res[1]["text"] == "w0 w1 "


# ------------------------------------------------------------------ duplicates


@pytest.mark.parametrize("nodes", [[E.logged_square], E.GATED_SQUARE, [E.async_square]],
                         ids=["columnar", "per-item", "async"])
def test_duplicate_items_compute_once_with_a_cache(engine, nodes, tmp_path, logs):
    graph = Graph(nodes, engine=engine, cache=DiskCache(tmp_path / "c"))
    values = [5, 5, 6, 7, 8, 9, 10, 5]  # the first two share a batch on every engine
    res = graph.map({"v": values, "log_dir": str(logs)}, map_over="v")
    assert [r["sq"] for r in res] == [v * v for v in values]
    ran = E.calls(logs)
    assert [c for c in ran if c != 5] == [6, 7, 8, 9, 10] and 1 <= ran.count(5) <= 2
    cached = [h.cached for r in res for h in r.history if h.node_id == nodes[-1].name]
    assert cached[2:7] == [False] * 5 and cached.count(False) == len(ran)  # the rest are hits


def test_duplicate_items_compute_each_time_without_a_cache(engine, logs):
    res = Graph([E.logged_square], engine=engine).map(
        {"v": [5, 5], "log_dir": str(logs)}, map_over="v")
    assert [r["sq"] for r in res] == [25, 25]
    assert E.calls(logs) == [5, 5]


def test_nested_map_over_follows_the_same_duplicate_rule(engine, tmp_path, logs):
    graph = Graph([E.SQUARES], engine=engine, cache=DiskCache(tmp_path / "c"))
    res = graph.map({"vs": [[5, 5, 5], [5, 7]], "log_dir": str(logs)}, map_over="vs")
    assert [r["sqs"] for r in res] == [[25, 25, 25], [25, 49]]
    assert sorted(set(E.calls(logs))) == [5, 7] and E.calls(logs).count(7) == 1
    assert E.calls(logs).count(5) <= 2  # once per call; a parallel engine may run both at once
    plain = Graph([E.SQUARES], engine=engine).map(
        {"vs": [[8, 8]], "log_dir": str(logs)}, map_over="vs")
    assert plain[0]["sqs"] == [64, 64] and E.calls(logs).count(8) == 2  # no cache: each runs


# ------------------------------------------------------------------ cache hits and events


@pytest.mark.parametrize("nodes", [[E.logged_square], E.GATED_SQUARE], ids=["columnar", "per-item"])
def test_a_cache_hit_reports_only_its_end(engine, nodes, tmp_path, logs):
    cache = DiskCache(tmp_path / "c")
    inputs = {"v": [1, 2], "log_dir": str(logs)}
    Graph(nodes, engine=engine, cache=cache).map(inputs, map_over="v")
    events = Events()
    Graph(nodes, engine=engine, cache=cache, callbacks=[events]).map(inputs, map_over="v")
    hits = [e for e in events.ends if e.node_id == "logged_square"]
    assert len(hits) == 2 and all(e.cached for e in hits)
    assert [e.node_id for e in events.starts if e.node_id == "logged_square"] == []


# ------------------------------------------------------------------ nested interrupts


def test_map_over_a_nested_interrupt_raises_naming_it(engine):
    with pytest.raises(TypeError, match=r"approval.*review|review.*approval"):
        Graph(E.outer_review(), engine=engine).map({"topic": ["a", "b"]}, map_over="topic")
