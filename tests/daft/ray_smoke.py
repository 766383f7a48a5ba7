"""Run by test_ray.py in a fresh process: a local Ray, then maps on DaftEngine(runner="ray")
(in memory, and one dataset map written with ``into=``)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq
import ray

from hypernodes_daft import DaftEngine
from hypernodes_dist import DiskCache, Graph, node
from tests.conformance import graphs as G


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


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        engine = DaftEngine(runner="ray", batch_size=3)
        chain = Graph(G.CHAIN, engine=engine).map({"x": list(range(8))}, map_over="x")
        stats = Graph(G.STATS, engine=engine).map({"data": [[1, 3], [2, 2, 2]]}, map_over="data")
        failed = Graph(G.FRAGILE, engine=engine).map(
            {"x": [1, 3, 5]}, map_over="x", on_error="collect"
        )
        with tempfile.TemporaryDirectory() as tmp:
            data = Graph(G.CHAIN, engine=engine).map(
                source=pa.table({"x": list(range(8))}), into=f"{tmp}/out", select=["c"])
            rows = data.to_arrow().sort_by("_hn_row")
            pq.write_table(pa.table({"x": list(range(40))}), f"{tmp}/src.parquet",
                           row_group_size=10)
            cached = Graph([pid_of], engine=engine, cache=DiskCache(f"{tmp}/cache"))
            parts = cached.map(source=f"{tmp}/src.parquet", into=f"{tmp}/pids")
            pids = set(parts.to_arrow().column("pid").to_pylist())
            heard, heard_into = Heard(), Heard()
            Graph([slow], engine=engine, callbacks=[heard]).map(
                {"x": list(range(60))}, map_over="x")
            Graph([slow], engine=engine, callbacks=[heard_into]).map(
                source=pa.table({"x": list(range(60))}), into=f"{tmp}/slow")
        out = {
            "progress": heard.done,
            "progress_into": heard_into.done,
            "dataset_c": rows.column("c").to_pylist(),
            "dataset_rows": parts.rows,
            "parts_in_driver": os.getpid() in pids,
            "c": [r["c"] for r in chain],
            "summary": [r["summary"] for r in stats],
            "status": [r.status for r in failed],
            "error": type(failed[1].error).__name__,
            "notes": getattr(failed[1].error, "__notes__", []),
        }
    finally:
        ray.shutdown()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
