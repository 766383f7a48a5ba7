"""map() behaviours every engine must reproduce exactly."""

from __future__ import annotations

import itertools

import pytest

from hypernodes_dist import Graph, MapResult
from hypernodes_dist.events import NodeEndEvent

from . import graphs as G


def test_zip_map_results_in_item_order(engine):
    xs = list(range(257))
    res = Graph(G.CHAIN, engine=engine).map({"x": xs, "y": "k"}, map_over="x")
    assert isinstance(res, MapResult)
    assert [r["c"] for r in res] == [G.chain_expected(x, "k")["c"] for x in xs]
    assert all(r.status == "complete" for r in res)
    assert res[5].outputs == G.chain_expected(5, "k")


def test_zip_over_two_parameters(engine):
    res = Graph(G.CHAIN, engine=engine).map({"x": [1, 2, 3], "y": ["a", "b", "c"]}, map_over=["x", "y"])
    assert [r["c"] for r in res] == ["4-a", "6-b", "8-c"]


def test_product_order_follows_itertools_product(engine):
    xs, ys = [1, 2], ["a", "b", "c"]
    res = Graph(G.CHAIN, engine=engine).map(
        {"x": xs, "y": ys}, map_over=["x", "y"], map_mode="product"
    )
    assert len(res) == 6
    expected = [G.chain_expected(x, y)["c"] for x, y in itertools.product(xs, ys)]
    assert [r["c"] for r in res] == expected


def test_product_order_follows_map_over_order(engine):
    res = Graph(G.CHAIN, engine=engine).map(
        {"x": [1, 2], "y": ["a", "b", "c"]}, map_over=["y", "x"], map_mode="product"
    )
    assert [r["c"] for r in res] == [G.chain_expected(x, y)["c"]
                                     for y, x in itertools.product(["a", "b", "c"], [1, 2])]


def test_broadcast_and_defaults(engine):
    g = Graph(G.CHAIN, engine=engine)
    assert [r["c"] for r in g.map({"x": [1, 2]}, map_over="x")] == ["4-y", "6-y"]
    assert [r["c"] for r in g.map({"x": [1, 2], "y": "z"}, map_over="x")] == ["4-z", "6-z"]


def test_select_limits_outputs(engine):
    res = Graph(G.CHAIN, engine=engine).map({"x": [1, 2, 3]}, map_over="x", select=["c"])
    assert [dict(r) for r in res] == [{"c": "4-y"}, {"c": "6-y"}, {"c": "8-y"}]
    assert "a" not in res[0]


def test_empty_list_gives_empty_result(engine):
    res = Graph(G.CHAIN, engine=engine).map({"x": []}, map_over="x")
    assert isinstance(res, MapResult) and len(res) == 0 and res.errors == []


def test_zip_length_mismatch_names_each_parameter(engine):
    g = Graph(G.CHAIN, engine=engine)
    with pytest.raises(ValueError) as info:
        g.map({"x": [1, 2, 3], "y": ["a", "b"]}, map_over=["x", "y"])
    assert "'x' has 3" in str(info.value) and "'y' has 2" in str(info.value)


def test_missing_inputs_are_all_listed(engine):
    g = Graph(G.CHAIN + [G.label], engine=engine)
    with pytest.raises(ValueError) as info:
        g.map({"y": ["a"]}, map_over="y")
    assert "'product'" in str(info.value) and "'x'" in str(info.value)


def test_interrupt_graph_cannot_be_mapped(engine):
    with pytest.raises(TypeError, match="InterruptNode"):
        Graph(G.INTERRUPT, engine=engine).map({"x": [1, 2]}, map_over="x")


def test_raise_surfaces_original_type_with_node_and_item(engine):
    g = Graph(G.FRAGILE, engine=engine)
    with pytest.raises(G.ItemFailure) as info:
        g.map({"x": list(range(10)), "bad": (7,)}, map_over="x")
    text = str(info.value) + " ".join(getattr(info.value, "__notes__", []))
    assert "fragile" in text and "item 7" in text


def test_collect_keeps_every_other_item(engine):
    xs = list(range(40))
    res = Graph(G.FRAGILE, engine=engine).map(
        {"x": xs, "bad": (3, 17, 39)}, map_over="x", on_error="collect"
    )
    assert len(res) == 40
    assert [r.status for r in res].count("error") == 3
    assert [xs.index(x) for x in (3, 17, 39)] == [i for i, r in enumerate(res) if r.status == "error"]
    assert all(isinstance(r.error, G.ItemFailure) for r in res.errors)
    assert "fragile" in " ".join(res.errors[0].error.__notes__)
    ok = [r for r in res if r.status == "complete"]
    assert [r["after"] for r in ok] == [x * 100 + 1 for x in xs if x not in (3, 17, 39)]
    assert "after" not in res[3]


def test_multi_output_unpacking_and_defaults(engine):
    g = Graph(G.STATS, engine=engine)
    res = g.map({"data": [[1, 3], [2, 2, 2]], "precision": 1}, map_over="data")
    assert [(r["mean"], r["std"]) for r in res] == [(2.0, 1.0), (2.0, 0.0)]
    assert [r["summary"] for r in res] == ["2.0±1.0", "2.0±0.0"]


def test_wrong_output_shape_is_an_item_error_naming_the_node(engine):
    res = Graph([G.wrong_shape], engine=engine).map({"x": [1, 2, 3]}, map_over="x", on_error="collect")
    assert [r.status for r in res] == ["complete", "error", "complete"]
    assert "wrong_shape" in str(res[1].error)
    assert (res[0]["p"], res[0]["q"]) == (1, -1)


def test_branch_in_map(engine):
    data = [{"valid": True, "v": 1}, {"valid": False, "v": 2}, {"v": 3}]
    res = Graph(G.BRANCH, engine=engine).map({"data": data}, map_over="data")
    assert [r["report"] for r in res] == ["ok:1!", "bad:2!", "bad:3!"]


def test_gate_with_end_in_map(engine):
    res = Graph(G.GATE, engine=engine).map({"query": ["q1", "stop", "q2"]}, map_over="query")
    assert res[0]["answer"] == "q1:2" and res[2]["answer"] == "q2:2"
    assert res[1].status == "complete" and "answer" not in res[1]


@pytest.mark.parametrize("nodes,columnar", [(G.END_CHAIN, True), (G.END_BESIDE, False)],
                         ids=["chain", "beside"])
def test_acyclic_end_gate_matches_run(engine, nodes, columnar):
    g = Graph(nodes, engine=engine)
    assert g.plan.columnar is columnar  # the columnar strategy, or the per-item scheduler
    xs = list(range(9))
    res = g.map({"x": xs}, map_over="x")
    for x, r in zip(xs, res):  # a map item is exactly a run of the same graph
        alone = Graph(nodes).run({"x": x})
        assert dict(r) == dict(alone) and r.status == alone.status == "complete"
        assert [h.node_id for h in r.history] == [h.node_id for h in alone.history]
    assert "summary" not in res[0] and "summary" not in res[4]  # ENDed: nothing after the gate
    assert res[1]["summary"] == "1:d1/1"


def test_cycle_in_map_matches_reference(engine):
    topics = ["a", "ai", "a long topic", "xy"]
    res = Graph(G.CYCLE, engine=engine).map({"topic": topics, "target": 9}, map_over="topic")
    assert [r["final"] for r in res] == [G.cycle_expected(t, 9) for t in topics]


def test_async_nodes_in_map(engine):
    res = Graph(G.ASYNC, engine=engine).map({"x": list(range(30))}, map_over="x")
    assert [r["total"] for r in res] == [x * 10 + x + 1 for x in range(30)]


def test_streaming_nodes_are_joined_in_map(engine):
    res = Graph(G.STREAMING, engine=engine).map({"text": ["a b", "c dd e"]}, map_over="text")
    assert [r["words"] for r in res] == [[1, 1], [1, 2, 1]]
    assert [r["shout"] for r in res] == ["A B ", "C DD E "]


def test_python_objects_and_none_values(engine):
    products = [G.Product("a", 1.5), G.Product("b", 2)]
    res = Graph([G.label, G.returns_none], engine=engine).map(
        {"product": products, "x": [1, 2]}, map_over=["product", "x"]
    )
    assert [r["label"] for r in res] == ["a@1.50EUR", "b@2.00EUR"]
    assert all(r["nothing"] is None and "nothing" in r for r in res)


def test_ids_session_shared_runs_unique(engine):
    res = Graph(G.CHAIN, engine=engine).map({"x": list(range(20))}, map_over="x", session_id="s-1")
    assert {r.session_id for r in res} == {"s-1"}
    assert len({r.run_id for r in res}) == 20
    other = Graph(G.CHAIN, engine=engine).map({"x": [1]}, map_over="x")
    assert other[0].session_id.startswith("sess_") and other[0].run_id not in {r.run_id for r in res}


def test_node_end_event_for_every_node_of_every_item(engine):
    ends: list[NodeEndEvent] = []

    class Collect:
        def on_node_end(self, event):
            ends.append(event)

    res = Graph(G.CHAIN, engine=engine, callbacks=[Collect()]).map({"x": list(range(12))}, map_over="x")
    assert len(ends) == 36
    assert {(e.run_id, e.node_id) for e in ends} == {
        (r.run_id, n) for r in res for n in ("inc", "double", "fmt")
    }
    assert not any(e.cached for e in ends)


def test_history_lists_node_executions(engine):
    res = Graph(G.CHAIN, engine=engine).map({"x": [1, 2]}, map_over="x")
    assert [h.node_id for h in res[1].history] == ["inc", "double", "fmt"]
    cyc = Graph(G.CYCLE, engine=engine).map({"topic": ["abcde"], "target": 10}, map_over="topic")
    ids = [h.node_id for h in cyc[0].history]
    assert ids.count("revise") == 2 and ids[-1] == "finalize"


def test_to_arrow_and_pandas(engine):
    res = Graph(G.FRAGILE, engine=engine).map({"x": [1, 3, 5]}, map_over="x", on_error="collect")
    table = res.to_arrow()
    assert table.column("after").to_pylist() == [101, None, 501]
    df = res.to_pandas()
    assert list(df["safe"][[0, 2]]) == [100, 500]


def test_run_on_every_engine(engine):
    g = Graph(G.CYCLE, engine=engine)
    r = g.run({"topic": "ab", "target": 6})
    assert r["final"] == G.cycle_expected("ab", 6) and r.status == "complete"
    r = Graph(G.CHAIN, engine=engine).run({"x": 4}, select=["c"])
    assert dict(r) == {"c": "10-y"}


def test_run_error_policy(engine):
    g = Graph(G.FRAGILE, engine=engine)
    with pytest.raises(G.ItemFailure) as info:
        g.run({"x": 3})
    assert "fragile" in " ".join(info.value.__notes__)
    r = g.run({"x": 3}, on_error="collect")
    assert r.status == "error" and isinstance(r.error, G.ItemFailure)


def test_nodes_without_parameters(engine):
    res = Graph(G.CONSTANTS, engine=engine).map({"x": [1, 2, 3]}, map_over="x")
    assert [r["total_k"] for r in res] == [16, 17, 18]
    assert Graph(G.CONSTANTS, engine=engine).run({"x": 0})["total_k"] == 15


def test_branch_not_taken_uses_defaults_or_skips(engine):
    res = Graph(G.DEFAULTS, engine=engine).map({"x": [2, -1, 0, 5]}, map_over="x")
    assert [r["combined"] for r in res] == ["2:E2", "-1:none", "0:none", "5:E5"]
    assert [r.get("strict") for r in res] == ["e2", None, None, "e5"]
    assert [r.get("base") for r in res] == [None, "P-1", "P0", None]
    assert sorted(h.node_id for h in res[1].history) == ["combine", "plain", "rich"]
    single = Graph(G.DEFAULTS, engine=engine).run({"x": -1})
    assert dict(single) == dict(res[1])


def test_gate_without_end_routes_per_item(engine):
    res = Graph(G.ROUTE, engine=engine).map(
        {"kind": ["up", "low", "x", "u"], "text": "MiXed"}, map_over="kind")
    assert [r["final_text"] for r in res] == ["MiXed->MIXED", "MiXed->mixed", "MiXed->5", "MiXed->MIXED"]
    with pytest.raises(ValueError, match="missing required input"):
        Graph(G.ROUTE, engine=engine).map({"kind": ["u"]}, map_over="kind")
