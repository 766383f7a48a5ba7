"""``map(progress=True)``: a tqdm bar with items done, rate, ETA, cache hits and errors, on
every engine (the bar lives in the driver; engines only hand batches back)."""

from __future__ import annotations

import re
import time

import pytest

from hypernodes_dist import DiskCache, Graph, GraphEngine, node


@node(output_name="y")
def half(x: int) -> float:
    if x == 7:
        raise ValueError("seven")
    return x / 2


def _engine(name: str):
    if name == "local":
        return GraphEngine(batch_size=4)
    engines = pytest.importorskip("hypernodes_dist.engines")
    if name == "dask":
        pytest.importorskip("dask")
        return engines.DaskEngine(scheduler="threads", partition_size=4, num_workers=2)
    pytest.importorskip("daft")
    return engines.DaftEngine(batch_size=4)


@pytest.mark.parametrize("engine_name", ["local", "dask", "daft"])
def test_progress_bar_reports_items_rate_hits_and_errors(engine_name, tmp_path, capsys):
    engine = _engine(engine_name)
    try:
        g = Graph([half], engine=engine, cache=DiskCache(tmp_path / "c"))
        g.map({"x": list(range(20))}, map_over="x", on_error="collect", progress=True)
        capsys.readouterr()
        result = g.map({"x": list(range(20))}, map_over="x", on_error="collect", progress=True)
    finally:
        engine.close()
    assert len(result.errors) == 1
    err = capsys.readouterr().err
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    assert f"map [{engine.name}]" in final
    assert "20/20" in final  # items done / total
    assert re.search(r"item/s|s/item", final)  # rate
    assert re.search(r"<\d\d:\d\d", final)  # elapsed<ETA
    assert "cache_hits=19" in final  # the failed item is never cached
    assert "errors=1" in final


def test_no_bar_without_progress(capsys):
    Graph([half]).map({"x": [1, 2]}, map_over="x")
    assert "map [" not in capsys.readouterr().err


@node(output_name="y")
def slow_half(x: int) -> float:
    time.sleep(0.005)
    if x == 7:
        raise ValueError("seven")
    return x / 2


@pytest.mark.parametrize("engine_name", ["local", "dask", "daft"])
def test_dataset_bar_shows_rows_rate_eta_failed_and_resumed_rows(engine_name, tmp_path,
                                                                 capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    engine = _engine(engine_name)
    source, out = pa.table({"x": list(range(40))}), tmp_path / "out"
    try:
        g = Graph([slow_half], engine=engine)
        g.map(source=source, into=out, on_error="collect", progress=True, commit_seconds=0.05)
        files = sorted(out.glob("part-*.parquet"))
        assert len(files) > 1
        lost = pq.read_metadata(files[-1]).num_rows
        files[-1].unlink()  # as if killed before that file was written
        capsys.readouterr()
        res = g.map(source=source, into=out, on_error="collect", progress=True,
                    commit_seconds=0.05)
    finally:
        engine.close()
    assert res.rows == 40 and res.failed == 1
    final = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert f"map [{engine.name}] -> parquet" in final
    assert "40/40" in final  # rows in files / total
    assert re.search(r"row/s|s/row", final)  # this run's rate
    assert re.search(r"<\d\d:\d\d", final)  # elapsed<ETA
    assert re.search(r"failed=\d", final)
    assert f"resumed={40 - lost}" in final  # rows an earlier run had written
