"""``MapResult`` and ``DatasetResult`` count the same way and read their errors the same way,
on every engine: ``rows``, ``failed``, ``unfinished`` (rows a budget refused), ``resumed``
(rows an earlier run finished), ``pending``; ``errors`` as items and as a table."""

from __future__ import annotations

import pytest

from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.errors import BudgetExceededError

from . import result_graphs as R

XS = list(range(30))
BROKEN = [x for x in XS if x % 7 == 3]


def _counts(res) -> tuple[int, int, int, int, int]:
    return res.rows, res.failed, res.unfinished, res.resumed, res.pending


@pytest.mark.parametrize("into", [False, True], ids=["memory", "into"])
def test_counts_and_errors_read_the_same_in_memory_and_in_files(engine, tmp_path, into):
    g = Graph([R.priced_or_broken], engine=engine)
    kw = {"into": str(tmp_path / "out")} if into else {}
    res = g.map({"x": XS}, map_over="x", on_error="collect", **kw)
    assert _counts(res) == (30, len(BROKEN), 0, 0, 0)
    assert all(isinstance(n, int) for n in _counts(res))
    # item by item: .row, .node, .error (an exception in memory, its text in files)
    failures = sorted(res.failures, key=lambda f: f.row)
    assert [(f.row, f.node) for f in failures] == [(x, "priced_or_broken") for x in BROKEN]
    assert f"broken item {BROKEN[0]}" in str(failures[0].error)
    # as a table: the same columns and values on both
    rows = sorted(res.errors.to_pylist(), key=lambda r: r["_hn_row"])
    assert rows == [{"_hn_row": x, "node": "priced_or_broken",
                     "error": f"ValueError: broken item {x}"} for x in BROKEN]
    assert res.errors.num_rows == len(res.errors) == len(BROKEN)
    assert res.errors.column("node").to_pylist() == ["priced_or_broken"] * len(BROKEN)


@pytest.mark.parametrize("into", [False, True], ids=["memory", "into"])
def test_a_budget_stop_counts_unfinished_rows_and_a_rerun_counts_resumed(engine, tmp_path,
                                                                          into):
    g = Graph([R.priced_or_broken], engine=engine, cache=DiskCache(tmp_path / "c"))
    kw = {"into": str(tmp_path / "out")} if into else {}
    first = g.map({"x": XS}, map_over="x", on_error="collect", budget={"cost": 8}, **kw)
    assert first.unfinished > 0 and first.rows + first.unfinished == 30
    # failed: rows that ran and failed; a refused row is unfinished, not failed
    assert first.failed == len(first.failures) - (0 if into else first.unfinished)
    assert first.failed <= len(BROKEN)
    if not into:  # in memory, a refused item is an item with its BudgetExceededError
        refused = [f for f in first.failures if isinstance(f.error, BudgetExceededError)]
        assert len(refused) == first.unfinished
        assert {f.node for f in refused} == {"priced_or_broken"}
    rest = g.map({"x": XS}, map_over="x", on_error="collect", **kw)
    assert (rest.rows, rest.failed, rest.unfinished, rest.pending) == (30, len(BROKEN), 0, 0)
    # what the first run finished is not computed again: resumed from files or the cache
    finished_ok = first.rows - first.failed
    assert rest.resumed == (first.rows if into else finished_ok)


@pytest.mark.parametrize("first_here", [True, False], ids=["then-local", "local-then"])
def test_a_dataset_half_written_by_one_engine_and_finished_by_another_has_one_schema(
        engine, logs, tmp_path, first_here):
    """Every part file has the same Arrow schema whoever wrote it (``_hn_usage`` included:
    Daft's writer stores large strings, the other writers cast to them), and the dataset
    reads back with the map's output schema."""
    import pyarrow.parquet as pq

    from hypernodes_dist import GraphEngine

    from . import usage_graphs as U

    local = GraphEngine()
    engines = [engine, local] if first_here else [local, engine]
    into, xs = str(tmp_path / "out"), list(range(40))
    first = Graph([U.priced], engine=engines[0]).map(
        {"x": xs, "log_dir": logs}, map_over="x", into=into, budget={"cost": 2.0},
        on_error="collect")
    assert 0 < first.rows < 40 and first.unfinished == 40 - first.rows
    rest = Graph([U.priced], engine=engines[1]).map(
        {"x": xs, "log_dir": logs}, map_over="x", into=into)
    assert (rest.rows, rest.unfinished, rest.resumed) == (40, 0, first.rows)
    schemas = {pq.read_schema(p).remove_metadata() for p in (tmp_path / "out").glob("part-*")}
    assert len(schemas) == 1, schemas
    table = rest.to_arrow().sort_by("_hn_row")
    assert str(table.schema.field("_hn_usage").type).startswith("map<string, double")
    assert [dict(u) for u in table.column("_hn_usage").to_pylist()] == [
        {"tokens": x, "cost": pytest.approx(x / 100)} for x in xs]
    assert table.column("y").to_pylist() == [2 * x for x in xs]
