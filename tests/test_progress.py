"""``map(progress=True)``: a tqdm bar with items done, rate, ETA, cache hits and errors, on
every engine (the bar lives in the driver; engines only hand batches back)."""

from __future__ import annotations

import re

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
