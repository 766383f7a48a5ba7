"""Daft errors that say what to fix: the Ray runner without Ray, and unpicklable inputs."""

from __future__ import annotations

import sys

import pytest

from hypernodes_dist import Graph
from hypernodes_dist.errors import UnpicklableError
from tests.reliability import graphs as R


def test_the_ray_runner_without_ray_names_the_extra(monkeypatch):
    from hypernodes_daft import DaftEngine

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ImportError, match=r"hypernodes-dist-daft\[ray\]"):
        DaftEngine(runner="ray")


def test_an_unpicklable_broadcast_input_is_one_error_type_on_every_engine(tmp_path):
    from hypernodes_daft import DaftEngine
    from hypernodes_dask import UnpicklableError as DaskUnpicklable

    assert DaskUnpicklable is UnpicklableError
    graph = Graph([R.logged_inc, R.echo], engine=DaftEngine(batch_size=2))
    with pytest.raises(UnpicklableError, match=r"input 'handle'") as info:
        graph.map({"x": [1, 2], "log_dir": str(tmp_path), "handle": R.Handle()}, map_over="x")
    assert "pass it as an input" not in str(info.value)  # it already is one


def test_an_unpicklable_broadcast_input_of_a_dataset_map_is_the_same_error(tmp_path):
    import pyarrow as pa

    from hypernodes_daft import DaftEngine

    graph = Graph([R.logged_inc, R.echo], engine=DaftEngine())
    with pytest.raises(UnpicklableError, match=r"input 'handle'"):
        graph.map(source=pa.table({"x": [1, 2]}), into=str(tmp_path / "out"),
                  inputs={"log_dir": str(tmp_path), "handle": R.Handle()})
    calls = [p for p in tmp_path.iterdir() if len(p.name) == 32]  # logged_inc: a file a call
    assert not calls  # refused before anything ran

