"""Maps on DaftEngine(runner="ray") (in memory, and dataset maps written with ``into=``).

Not collected by the main session (Daft fixes its runner once per process, and that session
runs Daft natively): ``tests/daft/test_ray_conformance.py`` runs it in the pytest process
of the conformance suite's ``daft-ray`` variant, over that process's one local Ray."""

from __future__ import annotations

import logging
import os
import re
import signal
import time

import pyarrow as pa
import pyarrow.parquet as pq

from hypernodes_daft import DaftEngine
from hypernodes_dist import DiskCache, Graph, node
from tests.conformance import graphs as G
from tests.conformance.engines_daft import ray_engine


@node(output_name="pid")
def pid_of(x: int) -> int:
    return os.getpid()


@node(output_name="y")
def slow(x: int) -> int:
    time.sleep(0.05)
    return x


class Heard:
    """``ProgressEvent.done`` values as they arrive (from the map's Ray actor)."""

    def __init__(self) -> None:
        self.done: list[int] = []

    def on_progress(self, event) -> None:
        self.done.append(event.done)


def test_map_on_daft_ray_runner(tmp_path):
    ray_engine()  # the session's local Ray (started by the first engine of the session)
    engine = DaftEngine(runner="ray", batch_size=3)
    chain = Graph(G.CHAIN, engine=engine).map({"x": list(range(8))}, map_over="x")
    assert [r["c"] for r in chain] == [G.chain_expected(x)["c"] for x in range(8)]
    stats = Graph(G.STATS, engine=engine).map({"data": [[1, 3], [2, 2, 2]]}, map_over="data")
    assert [r["summary"] for r in stats] == ["2.0±1.0", "2.0±0.0"]
    failed = Graph(G.FRAGILE, engine=engine).map({"x": [1, 3, 5]}, map_over="x",
                                                 on_error="collect")
    assert [r.status for r in failed] == ["complete", "error", "complete"]
    assert type(failed[1].error).__name__ == "ItemFailure"
    assert any("fragile" in n for n in getattr(failed[1].error, "__notes__", []))
    data = Graph(G.CHAIN, engine=engine).map(
        source=pa.table({"x": list(range(8))}), into=tmp_path / "out", select=["c"])
    assert data.to_arrow().sort_by("_hn_row").column("c").to_pylist() == [r["c"] for r in chain]


def test_dataset_parts_run_as_ray_tasks_and_progress_comes_from_the_workers(tmp_path):
    ray_engine()
    engine = DaftEngine(runner="ray", batch_size=3)
    pq.write_table(pa.table({"x": list(range(40))}), tmp_path / "src.parquet",
                   row_group_size=10)
    cached = Graph([pid_of], engine=engine, cache=DiskCache(tmp_path / "cache"))
    parts = cached.map(source=str(tmp_path / "src.parquet"), into=tmp_path / "pids")
    assert parts.rows == 40
    assert os.getpid() not in set(parts.to_arrow().column("pid").to_pylist())  # Ray tasks did it
    heard, heard_into = Heard(), Heard()
    Graph([slow], engine=engine, callbacks=[heard]).map({"x": list(range(60))}, map_over="x")
    Graph([slow], engine=engine, callbacks=[heard_into]).map(
        source=pa.table({"x": list(range(60))}), into=tmp_path / "slow")
    for done in (heard.done, heard_into.done):  # counts from the Ray workers
        assert done[-1] == 60 and done == sorted(done) and len(set(done)) >= 4, done


def test_close_does_not_wait_for_worker_processes_that_ended(caplog):
    """Ray worker processes that ran batches and have since ended (Ray stops idle workers
    beyond the node's CPUs after a second, and kills workers for memory) never answer the
    close: the close says they had ended and waits only for the others; the job's close
    signal (an actor the driver owns) did not end with them. The last test of the module:
    it kills the Ray workers that ran its map."""
    ray_engine()
    engine = DaftEngine(runner="ray", batch_size=2)
    res = Graph([pid_of], engine=engine).map({"x": list(range(8))}, map_over="x")
    ran = sorted({r["pid"] for r in res})
    assert os.getpid() not in ran
    for pid in ran:
        os.kill(pid, signal.SIGKILL)
    with caplog.at_level(logging.INFO, logger="hypernodes_daft"):
        engine.close()
    ended = re.search(r"DaftEngine\.close: (\d+) of the (\d+) Ray worker processes that ran "
                      r"this job's batches had ended", caplog.text)
    assert ended and int(ended.group(1)) >= len(ran), caplog.text
    assert "teardown actor had ended" not in caplog.text
