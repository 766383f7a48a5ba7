"""Nested graphs as nodes, with map_over inside, on every engine."""

from __future__ import annotations

import pytest

from hypernodes_dist import DiskCache, Graph, GraphEngine

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
