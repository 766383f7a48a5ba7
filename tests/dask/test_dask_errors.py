"""Dask errors that say what to fix: scripts without a main guard, exceptions and return
values that cannot cross a process boundary, addresses given where a client or a scheduler
name was expected, and workers that cannot import the user's module."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hypernodes_dist import Graph
from hypernodes_dist.errors import UnpicklableError

from .edge_nodes import factor_of, fails_while_another_runs, locked_failure, returns_lock

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """\
from hypernodes_dist import Graph, node
from hypernodes_dask import DaskEngine


@node(output_name="y")
def inc(x: int) -> int:
    return x + 1


engine = DaskEngine(scheduler="processes", num_workers=1)
print(Graph([inc], engine=engine).map({"x": [1, 2]}, map_over="x").column("y"))
engine.close()
"""


def _python(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, input=stdin, capture_output=True,
                          text=True, timeout=120)


def test_a_script_without_a_main_guard_is_told_so(tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    out = _python(["job.py"], tmp_path)
    assert out.returncode != 0
    assert 'if __name__ == "__main__":' in out.stderr and "job.py" in out.stderr
    assert "killed" not in out.stderr  # not mistaken for a dead worker


def test_a_script_read_from_stdin_is_told_so(tmp_path):
    out = _python(["-"], tmp_path, stdin=SCRIPT)
    assert out.returncode != 0
    assert "standard input" in out.stderr and "scheduler=\"threads\"" in out.stderr


def test_a_guarded_script_runs(tmp_path):
    body = SCRIPT.replace("engine = ", "if __name__ == '__main__':\n    engine = ")
    body = body.replace("\nprint(", "\n    print(").replace("\nengine.close", "\n    engine.close")
    (tmp_path / "job.py").write_text(body)
    out = _python(["job.py"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2, 3]"


def test_a_compound_main_guard_counts_as_a_guard(tmp_path):
    body = SCRIPT.replace("engine = ", "if __name__ == '__main__' and len(sys.argv) == 1:\n"
                                       "    engine = ")
    body = body.replace("\nprint(", "\n    print(").replace("\nengine.close", "\n    engine.close")
    (tmp_path / "job.py").write_text("import sys\n" + body)
    out = _python(["job.py"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2, 3]"


def test_an_unpicklable_exception_reports_its_type_and_message(remote_engine):
    with pytest.raises(Exception) as info:
        Graph([locked_failure], engine=remote_engine).map({"x": [0, 1, 2]}, map_over="x")
    text = str(info.value) + " ".join(getattr(info.value, "__notes__", []))
    assert "LockedError: locked out at 1" in text and "locked_failure" in text
    assert "killed" not in text and info.value.hn_item == 1


def test_collect_an_unpicklable_return_value_as_that_items_error(remote_engine):
    res = Graph([returns_lock], engine=remote_engine).map(
        {"x": [0, 1, 2]}, map_over="x", on_error="collect")
    assert [r.status for r in res] == ["complete", "error", "complete"]
    assert [res[0]["y"], res[2]["y"]] == [0, 2]
    error = res[1].error
    assert isinstance(error, UnpicklableError)
    assert "returns_lock" in str(error) and "item 1" in str(error) and "'y'" in str(error)


def test_raise_on_an_unpicklable_return_value_names_node_and_item(remote_engine):
    with pytest.raises(UnpicklableError, match=r"node 'returns_lock'.*item 1"):
        Graph([returns_lock], engine=remote_engine).map({"x": [0, 1, 2]}, map_over="x")


def test_an_address_is_accepted_where_a_client_or_scheduler_is_expected():
    from hypernodes_dask import DaskEngine

    for engine in (DaskEngine("tcp://127.0.0.1:8786"),
                   DaskEngine(scheduler="tcp://127.0.0.1:8786")):
        assert engine.scheduler == "distributed"
        assert engine._cluster.address == "tcp://127.0.0.1:8786"
    with pytest.raises(ValueError, match=r"scheduler=.*address="):
        DaskEngine("threads")
    with pytest.raises(ValueError, match=r"address="):
        DaskEngine(scheduler="127.0.0.1:8786")


def test_workers_missing_the_users_module_are_told_what_to_do(distributed_engine, tmp_path,
                                                               monkeypatch):
    (tmp_path / "hn_private_nodes.py").write_text(textwrap.dedent("""\
        from dataclasses import dataclass

        from hypernodes_dist import node


        @dataclass
        class Settings:
            factor: int


        @node(output_name="y")
        def private(x: int, settings: Settings) -> int:
            return x * settings.factor
    """))
    monkeypatch.syspath_prepend(str(tmp_path))  # the driver sees it, the workers do not
    import hn_private_nodes

    with pytest.raises(ModuleNotFoundError) as info:
        Graph([hn_private_nodes.private], engine=distributed_engine).map(
            {"x": [1, 2], "settings": hn_private_nodes.Settings(3)}, map_over="x")
    text = str(info.value)
    assert "hn_private_nodes" in text and "upload_file" in text and "install" in text
    sys.modules.pop("hn_private_nodes", None)


def test_mapped_values_from_a_module_workers_lack_are_told_what_to_do(distributed_engine,
                                                                      tmp_path, monkeypatch):
    (tmp_path / "hn_private_items.py").write_text(textwrap.dedent("""\
        from dataclasses import dataclass


        @dataclass
        class Item:
            factor: int
    """))
    monkeypatch.syspath_prepend(str(tmp_path))  # the driver sees it, the workers do not
    import hn_private_items

    items = [hn_private_items.Item(2), hn_private_items.Item(3)]
    with pytest.raises(ModuleNotFoundError) as info:
        Graph([factor_of], engine=distributed_engine).map({"item": items}, map_over="item")
    text = str(info.value)
    assert "hn_private_items" in text and "upload_file" in text and "install" in text
    sys.modules.pop("hn_private_items", None)



@pytest.mark.parametrize("scheduler", ["threads", "processes", "distributed"])
def test_a_failed_partition_raises_after_the_running_ones_finish(tmp_path, request, scheduler):
    """On every scheduler that runs partitions at once (threads: the core waits for the
    batches of this process, ``execution/running.py``; the process pool; a cluster's
    workers), the map raises only once the partitions still running have finished: no
    work (no paid call, no cache write) goes on after it raised."""
    from hypernodes_dask import DaskEngine

    engine = (DaskEngine(client=request.getfixturevalue("client"), partition_size=1)
              if scheduler == "distributed" else
              DaskEngine(scheduler=scheduler, num_workers=2, partition_size=1))
    try:
        with pytest.raises(Exception, match="item 0 fails"):
            Graph([fails_while_another_runs], engine=engine).map(
                {"x": [0, 1], "log_dir": str(tmp_path)}, map_over="x")
        assert (tmp_path / "1-finished").exists()
    finally:
        engine.close()
