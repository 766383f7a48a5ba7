"""Nested graphs as nodes, with map_over inside, on every engine."""

from __future__ import annotations

import pytest

from hypernodes_dist import DiskCache, Graph, GraphEngine, node

from . import nested_graphs as N


@pytest.mark.parametrize("size", [0, 1, 50])
def test_nested_map_over_sizes(engine, size):
    doc = "|".join(f"pa{'a' * (i % 3)}ss{i}" for i in range(size))
    res = Graph(N.OUTER, engine=engine).run({"document": doc})
    assert res["norms"] == N.expected_norms(doc)
    assert res["score"] == sum(N.expected_norms(doc))
    assert len(res["norms"]) == size


def test_nested_in_map_with_renamed_io(engine):
    docs = ["a|bb|aaa", "", "xyz", "a" * 5 + "|b"]
    res = Graph(N.OUTER, engine=engine).map({"document": docs, "dim": 1}, map_over="document")
    assert [r["norms"] for r in res] == [N.expected_norms(d, 1) for d in docs]
    assert res[1]["norms"] == [] and res[1]["score"] == 0


def test_two_level_nesting(engine):
    corpora = [["a|aa", "bbb"], [], ["aaaa|a|b"]]
    res = Graph(N.TWO_LEVEL, engine=engine).map({"documents": corpora}, map_over="documents")
    expected = [[sum(N.expected_norms(d)) for d in c] for c in corpora]
    assert [r["scores"] for r in res] == expected
    assert [r["best"] for r in res] == [max(e) if e else -1 for e in expected]


def test_nested_node_cache_hits_across_engines(engine, tmp_path):
    cache = DiskCache(tmp_path / "c")
    docs = ["a|b", "aa|bb|cc"]
    Graph(N.OUTER, engine=GraphEngine(), cache=cache).map({"document": docs}, map_over="document")
    ends = []

    class Collect:
        def on_node_end(self, event):
            ends.append(event)

    res = Graph(N.OUTER, engine=engine, cache=cache, callbacks=[Collect()]).map(
        {"document": docs}, map_over="document")
    assert [r["score"] for r in res] == [sum(N.expected_norms(d)) for d in docs]
    assert len(ends) == 6 and all(e.cached for e in ends)


def test_inner_error_follows_outer_on_error(engine):
    res = Graph(N.OUTER, engine=engine).map(
        {"document": ["a|b", None, "c"]}, map_over="document", on_error="collect")
    assert [r.status for r in res] == ["complete", "complete", "complete"]
    res = Graph([N.EMBED_EACH], engine=engine).map(
        {"passages": [["a"], [None], ["bb"]]}, map_over="passages", on_error="collect")
    assert [r.status for r in res] == ["complete", "error", "complete"]
    assert "embed_each" in " ".join(res[1].error.__notes__)
    assert res[2]["norms"] == [2]


def test_inner_runs_report_as_nested_runs(engine):
    starts = []

    class Collect:
        def on_run_start(self, event):
            starts.append(event)

    res = Graph(N.OUTER, engine=engine, callbacks=[Collect()]).map(
        {"document": ["a|bb", "c"]}, map_over="document")
    outer = {r.run_id for r in res}
    inner = [e for e in starts if e.parent_run_id is not None]
    assert {e.run_id for e in starts if e.parent_run_id is None} == outer
    assert len(inner) == 3  # one inner run per passage
    assert {e.parent_run_id for e in inner} == outer
    assert len({e.run_id for e in inner}) == 3 and not ({e.run_id for e in inner} & outer)


def test_inner_runs_of_run_report_with_parent(engine):
    ends = []

    class Collect:
        def on_node_end(self, event):
            ends.append(event)

    r = Graph(N.OUTER, engine=engine, callbacks=[Collect()]).run({"document": "a|b"})
    inner = [e for e in ends if e.parent_run_id == r.run_id]
    assert sorted(e.node_id for e in inner) == ["embed", "embed", "norm", "norm"]
    assert {e.node_id for e in ends if e.parent_run_id is None} == {"split", "embed_each", "total"}


# ------------------------------------------------------------------ edges (issue 27)


class Errors:
    """Records the order of node errors and run starts as the driver receives them."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, int | None]] = []

    def on_node_error(self, event) -> None:
        self.seen.append((event.node_id, event.parent_run_id, event.item_index))


def test_a_failure_inside_reports_the_inner_node_then_the_nested_node(engine):
    errors = Errors()
    graph = Graph([N.CHECKER], engine=engine, callbacks=[errors])
    res = graph.map({"x": [1, 2, 3]}, map_over="x", on_error="collect")
    assert [r.status for r in res] == ["complete", "error", "complete"]
    assert isinstance(res[1].error, ValueError) and "inner check failed" in str(res[1].error)
    failed = [(node, parent is not None) for node, parent, _ in errors.seen]
    assert failed == [("check", True), ("checking", False)]  # inner first, as a child run
    assert errors.seen[0][1] == res[1].run_id  # the child of the failed item's run


def test_dropped_inner_outputs_are_not_computed(engine, tmp_path):
    logs = tmp_path / "calls"
    logs.mkdir()
    assert N.ONLY_A.params == ("log_dir", "x")
    res = Graph([N.ONLY_A], engine=engine).map(
        {"x": [1, 2, 3], "log_dir": str(logs)}, map_over="x")
    assert [r["only_a"] for r in res] == [2, 3, 4]
    assert N.calls(str(logs), "cheap") == 3 and N.calls(str(logs), "paid") == 0


def test_conflicting_defaults_of_one_input_are_rejected_at_build(engine):
    @node(output_name="y")
    def f(a: int, b: int = 1) -> int:
        return a + b

    @node(output_name="z")
    def g(c: int, b: int = 2) -> int:
        return c + b

    with pytest.raises(ValueError, match=r"'b' has different defaults.*f\(b=1\), g\(b=2\)"):
        Graph([f, g], engine=engine)

    @node(output_name="z")
    def same(c: int, b: int = 1) -> int:
        return c * b

    assert Graph([f, same], engine=engine).run({"a": 1, "c": 2})["z"] == 2
