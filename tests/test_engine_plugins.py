"""Engine discovery through the ``hypernodes_dist.engines`` entry-point group."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hypernodes_dist import Graph, GraphEngine
from hypernodes_dist import engines as registry
from hypernodes_dist.errors import EngineNotFoundError

from .conformance import graphs as G

TOY_ENGINE = '''
from hypernodes_dist.execution.batch import execute_batch
from hypernodes_dist.engines.base import Engine


class ToyEngine(Engine):
    """Runs batches of 3 items, last batch first (sinks may arrive in any order)."""

    name = "toy"

    def __init__(self):
        self.batches = 0

    def execute_map(self, job, sink):
        for start, stop in reversed(list(job.bounds(3))):
            self.batches += 1
            sink(execute_batch(job.plan, job.chunk(start, stop), job.settings))
'''


@pytest.fixture
def toy_plugin(tmp_path, monkeypatch):
    (tmp_path / "toy_engine_mod.py").write_text(TOY_ENGINE)
    dist = tmp_path / "toy_engine-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-engine\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[hypernodes_dist.engines]\ntoy = toy_engine_mod:ToyEngine\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh()
    yield
    registry.refresh()


def test_plugin_is_found_by_name_and_class(toy_plugin):
    assert "toy" in registry.available()
    cls = registry.get_engine("toy")
    from hypernodes_dist.engines import ToyEngine

    assert cls is ToyEngine
    engine = ToyEngine()
    res = Graph(G.CHAIN, engine=engine).map({"x": list(range(10))}, map_over="x")
    assert [r["c"] for r in res] == [G.chain_expected(x)["c"] for x in range(10)]
    assert engine.batches == 4


def test_engine_by_name_string(toy_plugin):
    g = Graph(G.CHAIN, engine="toy")
    assert type(g.engine).__name__ == "ToyEngine"
    assert g.map({"x": [1]}, map_over="x")[0]["a"] == 2


def test_unknown_engine_lists_installed(toy_plugin):
    with pytest.raises(EngineNotFoundError) as info:
        registry.get_engine("spark")
    assert "spark" in str(info.value) and "toy" in str(info.value) and "local" in str(info.value)
    with pytest.raises(AttributeError, match="SparkEngine.*installed engines: .*toy"):
        registry.SparkEngine  # noqa: B018
    with pytest.raises(ImportError):
        from hypernodes_dist.engines import SparkEngine  # noqa: F401


def test_local_engine_builtin():
    assert registry.get_engine("local") is GraphEngine
    assert isinstance(Graph(G.CHAIN).engine, GraphEngine)


def test_import_does_not_load_engines_or_heavy_deps():
    code = textwrap.dedent("""
        import sys
        import hypernodes_dist
        from hypernodes_dist import Graph, node, DiskCache
        heavy = [m for m in ("dask", "distributed", "daft", "ray", "pandas", "numpy", "pyarrow")
                 if m in sys.modules]
        print(",".join(heavy))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_engine_plugins_installed():
    """Both engine distributions register their entry points."""
    assert {"dask", "daft"} <= set(registry.available())
