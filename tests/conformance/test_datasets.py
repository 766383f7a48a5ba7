"""Datasets in, datasets out: ``map(source=..., into=...)`` behaves the same on every engine."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from hypernodes_dist import Graph, MapResult
from hypernodes_dist.datasets import DatasetResult

from . import dataset_graphs as D

N = 40


def _write_source(tmp_path, n: int = N, files: int = 2):
    """``n`` rows (``body``, ``review_id``) in ``files`` Parquet files of small row groups."""
    src = tmp_path / "reviews"
    src.mkdir()
    rows = D.texts(n)
    per = -(-n // files)
    for f in range(files):
        lo, hi = f * per, min(n, (f + 1) * per)
        table = pa.table({"body": rows[lo:hi], "review_id": list(range(lo, hi)),
                          "other": [1.5] * (hi - lo)})
        pq.write_table(table, src / f"part-{f}.parquet", row_group_size=6)
    (src / "_ignored.txt").write_text("not data")
    return src


def _sources(tmp_path):
    """Every kind of source, each with the rows of ``_write_source``."""
    import daft
    import dask.dataframe as dd

    src = _write_source(tmp_path)
    table = ds.dataset(src, format="parquet").to_table()
    files = sorted(str(p) for p in src.glob("*.parquet"))
    single = tmp_path / "single.parquet"
    pq.write_table(table, single, row_group_size=7)
    frame = table.to_pandas()
    return {
        "parquet file": str(single),
        "directory": str(src),
        "glob": os.path.join(str(src), "part-*.parquet"),
        "file URI": f"file://{src}",
        "pyarrow.Table": table,
        "RecordBatchReader": pa.RecordBatchReader.from_batches(table.schema,
                                                               table.to_batches(max_chunksize=9)),
        "pyarrow dataset": ds.dataset(files, format="parquet"),
        "in-memory pyarrow dataset": ds.dataset(table),
        "pandas": frame,
        "dask": dd.from_pandas(frame, npartitions=3),
        "daft": daft.read_parquet(files),
    }


def _check_rows(res: DatasetResult, n: int = N) -> pa.Table:
    assert isinstance(res, DatasetResult)
    table = res.to_arrow()
    rows = table.column("_hn_row").to_pylist()
    assert sorted(rows) == list(range(n)), "every row exactly once"
    assert table.schema.field("_hn_row").type == pa.int64()
    assert table.schema.field("_hn_error").type == pa.string()
    return table.sort_by("_hn_row")


def test_every_source_type(engine, tmp_path):
    g = Graph(D.ENRICH, engine=engine)
    want = [D.expected(t)["label"] for t in D.texts(N)]
    for kind, source in _sources(tmp_path).items():
        res = g.map(source=source, columns={"text": "body"}, keep=["review_id"],
                    into=tmp_path / f"out-{kind.replace(' ', '_')}")
        table = _check_rows(res)
        assert res.rows == N and res.failed == 0, kind
        assert table.column("review_id").to_pylist() == list(range(N)), kind
        assert table.column("label").to_pylist() == want, kind
        assert res.errors.num_rows == 0


def test_output_columns_types_and_readers(engine, tmp_path):
    src = _write_source(tmp_path)
    out = tmp_path / "out"
    res = Graph(D.WITH_OBJECT, engine=engine).map(
        source=str(src), columns={"text": "body"}, keep=["review_id", "other"],
        select=["words", "shape"], into=out)
    assert res.path == str(out)
    table = _check_rows(res)
    assert table.column_names == ["review_id", "other", "words", "shape", "_hn_row", "_hn_error"]
    assert table.schema.field("words").type == pa.int64()
    assert table.schema.field("other").type == pa.float64()
    frame = res.to_pandas().sort_values("_hn_row")
    texts = D.texts(N)
    assert list(frame["shape"]) == [(len(t.strip().lower()), t.strip().lower()[:1]) for t in texts]
    assert isinstance(res.dataset(), ds.Dataset)
    # a plain Parquet dataset: other readers see the same rows, ignoring _ and . files
    plain = ds.dataset(str(out), format="parquet").to_table()
    assert plain.num_rows == N and "_hn_row" in plain.column_names
    names = os.listdir(out)
    assert "_hn_manifest.json" in names
    assert all(n.endswith(".parquet") or n.startswith(("_", ".")) for n in names)


def test_on_error_collect_writes_errors_and_keeps_other_rows(engine, tmp_path):
    texts = D.texts(N)
    texts[3] = texts[17] = "boom"
    res = Graph(D.ENRICH, engine=engine).map(
        source=pa.table({"text": texts, "id": list(range(N))}), keep=["id"],
        into=tmp_path / "out", on_error="collect")
    assert res.failed == 2 and res.rows == N
    errors = res.errors
    assert errors.column_names == ["_hn_row", "node", "error"]
    assert sorted(errors.column("_hn_row").to_pylist()) == [3, 17]
    assert set(errors.column("node").to_pylist()) == {"normalize"}
    assert all("cannot normalize" in e for e in errors.column("error").to_pylist())
    table = _check_rows(res)
    failed = table.filter(pa.compute.is_valid(table.column("_hn_error")))
    assert failed.column("_hn_row").to_pylist() == [3, 17]
    assert failed.column("clean").null_count == 2
    ok = table.filter(pa.compute.is_null(table.column("_hn_error")))
    assert ok.num_rows == N - 2
    assert ok.column("clean").to_pylist() == [D.expected(t)["clean"]
                                              for i, t in enumerate(texts) if i not in (3, 17)]


def test_on_error_raise_names_node_and_row(engine, tmp_path):
    texts = D.texts(N)
    texts[11] = "boom"
    with pytest.raises(ValueError, match="cannot normalize") as info:
        Graph(D.ENRICH, engine=engine).map(source=pa.table({"text": texts}),
                                           into=tmp_path / "out")
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "normalize" in notes and "item 11" in notes


def test_broadcast_inputs_and_dict_inputs_into(engine, tmp_path):
    g = Graph(D.ENRICH, engine=engine)
    texts = D.texts(N)
    res = g.map(source=pa.table({"body": texts}), columns={"text": "body"},
                inputs={"bonus": 5}, into=tmp_path / "a")
    assert _check_rows(res).column("label").to_pylist() == [D.expected(t, 5)["label"]
                                                            for t in texts]
    res = g.map({"text": texts[:10], "bonus": [0, 1]}, map_over=["text", "bonus"],
                map_mode="product", into=tmp_path / "b", select=["label"])
    table = _check_rows(res, 20)
    assert table.column("label").to_pylist() == [D.expected(t, b)["label"]
                                                 for t in texts[:10] for b in (0, 1)]


def test_source_without_into_returns_a_map_result(engine, tmp_path):
    res = Graph(D.ENRICH, engine=engine).map(source=str(_write_source(tmp_path)),
                                             columns={"text": "body"})
    assert isinstance(res, MapResult) and len(res) == N
    assert [r["clean"] for r in res] == [D.expected(t)["clean"] for t in D.texts(N)]


def test_rerun_skips_finished_files_and_changed_map_raises(engine, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    source = pa.table({"x": list(range(N))})
    out = tmp_path / "out"
    g = Graph([D.logged_square], engine=engine)
    inputs = {"log_dir": str(logs)}
    first = g.map(source=source, inputs=inputs, into=out)
    assert sorted(D.logged(logs)) == list(range(N))
    files = sorted(p for p in os.listdir(out) if p.startswith("part-"))
    mtimes = {p: os.stat(out / p).st_mtime_ns for p in files}
    removed = files[-1]
    rows_removed = pq.read_table(out / removed).column("_hn_row").to_pylist()
    os.remove(out / removed)  # as if the map had been killed before writing it
    again = g.map(source=source, inputs=inputs, into=out)
    assert again.rows == first.rows == N
    counts = D.logged(logs)
    assert sorted(counts) == sorted(list(range(N)) + rows_removed)  # only that part again
    assert {p: os.stat(out / p).st_mtime_ns for p in files if p != removed} == {
        p: t for p, t in mtimes.items() if p != removed}
    _check_rows(again)
    with pytest.raises(ValueError, match="graph changed"):
        Graph(D.ENRICH, engine=engine).map(source=pa.table({"text": ["a"] * N}), into=out)
    with pytest.raises(ValueError, match="source changed"):
        g.map(source=pa.table({"x": list(range(1, N + 1))}), inputs=inputs, into=out)
    with pytest.raises(ValueError, match="'log_dir' changed"):
        g.map(source=source, inputs={"log_dir": str(tmp_path)}, into=out)
    res = Graph(D.ENRICH, engine=engine).map(source=pa.table({"text": ["a"] * 3}), into=out,
                                             overwrite=True)
    assert res.rows == 3 and _check_rows(res, 3).column("clean").to_pylist() == ["a"] * 3


def test_a_part_killed_before_its_file_was_written_is_all_cache_hits(engine, tmp_path):
    from hypernodes_dist import DiskCache

    logs, out = tmp_path / "logs", tmp_path / "out"
    logs.mkdir()
    g = Graph([D.logged_square], engine=engine, cache=DiskCache(tmp_path / "cache"))
    source, inputs = pa.table({"x": list(range(N))}), {"log_dir": str(logs)}
    g.map(source=source, inputs=inputs, into=out)
    assert sorted(D.logged(logs)) == list(range(N))
    for f in out.glob("part-*.parquet"):  # computed and cached, but no file was written
        f.unlink()
    again = g.map(source=source, inputs=inputs, into=out)
    assert again.rows == N and again.failed == 0
    assert sorted(D.logged(logs)) == list(range(N))  # the rerun computed nothing
    assert _check_rows(again).column("y").to_pylist() == [x * x for x in range(N)]


def _reader(table: pa.Table) -> pa.RecordBatchReader:
    return pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=9))


@pytest.mark.parametrize("kind", ["parquet rewritten in place", "RecordBatchReader",
                                  "in-memory daft frame"])
def test_a_source_whose_rows_changed_is_noticed_on_rerun(engine, tmp_path, kind):
    import daft

    before = pa.table({"text": D.texts(N)})
    after = pa.table({"text": [t.upper() for t in D.texts(N)]})  # same shape, other rows
    path = tmp_path / "rows.parquet"

    def source(table: pa.Table):
        if kind == "RecordBatchReader":
            return _reader(table)
        if kind == "in-memory daft frame":
            return daft.from_arrow(table)
        pq.write_table(table, path, row_group_size=7)
        return str(path)

    g, out = Graph(D.ENRICH, engine=engine), tmp_path / "out"
    first = g.map(source=source(before), into=out)
    assert first.rows == N
    again = g.map(source=source(before), into=out)  # unchanged: every part is kept
    assert again.rows == N and _check_rows(again).column("clean").to_pylist() == [
        D.expected(t)["clean"] for t in D.texts(N)]
    with pytest.raises(ValueError, match="source changed"):
        g.map(source=source(after), into=out)
    res = g.map(source=source(after), into=out, overwrite=True)
    assert _check_rows(res).column("clean").to_pylist() == [t.strip().lower() for t in D.texts(N)]


def test_bad_arguments_fail_before_anything_runs(engine, tmp_path):
    import pandas as pd

    g = Graph(D.ENRICH, engine=engine)
    table = pa.table({"body": ["a"], "id": [1]})
    with pytest.raises(ValueError, match="'text'.*body, id"):
        g.map(source=table, into=tmp_path / "o")
    with pytest.raises(ValueError, match="map_over/map_mode or source"):
        g.map({"text": ["a"]}, map_over="text", source=table)
    with pytest.raises(ValueError, match="map_over/map_mode or source"):
        g.map(source=table, columns={"text": "body"}, map_mode="product")
    with pytest.raises(ValueError, match="keep="):
        g.map(source=table, columns={"text": "body"}, keep=["nope"], into=tmp_path / "o")
    with pytest.raises(TypeError, match="source="):
        g.map({"text": pd.DataFrame({"text": ["a", "b"]})}, map_over="text")
    with pytest.raises(TypeError, match="source="):
        g.map({"text": table}, map_over="text")
    import daft
    import dask.dataframe as dd

    for frame in (_reader(table), dd.from_pandas(table.to_pandas(), npartitions=1),
                  daft.from_arrow(table), ds.dataset(table)):
        with pytest.raises(TypeError, match="source="):
            g.map({"text": frame}, map_over="text")
    assert not (tmp_path / "o").exists() or not any(
        p.startswith("part-") for p in os.listdir(tmp_path / "o"))


class _Ends:
    def __init__(self) -> None:
        self.ends: list[tuple[str, int]] = []

    def on_node_end(self, event) -> None:
        self.ends.append((event.node_id, event.item_index))


def test_callbacks_see_every_node_execution_and_empty_source(engine, tmp_path):
    seen = _Ends()
    g = Graph(D.ENRICH, engine=engine, callbacks=[seen])
    res = g.map(source=pa.table({"text": D.texts(N)}), into=tmp_path / "out", progress=True)
    assert res.rows == N
    assert sorted(seen.ends) == sorted((name, i) for name in ("normalize", "measure", "label")
                                       for i in range(N))
    empty = g.map(source=pa.table({"text": pa.array([], pa.string())}), into=tmp_path / "e")
    assert empty.rows == 0 and empty.failed == 0 and empty.to_arrow().num_rows == 0
