"""A whole Batch API job in its own process group, for the kill tests of
``test_batch_kill.py``: ``python -m tests.batch_job_child PROVIDER ENGINE BASE_URL
ANTHROPIC_URL INTO ROWS``. A dataset map (Parquet rows in, ``into=`` out) whose ``batch_api=True`` node
calls the real ``openai`` (sync) or ``anthropic`` client through a resource; prints one
JSON line: rows, pending, failed and the labels by row (``run``, which the local engine's
reruns call in the test's own process)."""

from __future__ import annotations

import json
import sys

import pyarrow as pa

from hypernodes_dist import Graph
from hypernodes_dist.engines.base import Engine
from tests.conformance import batch_api_graphs as B


def engine_of(name: str) -> Engine | None:
    if name == "dask-processes":
        from hypernodes_dask import DaskEngine

        # one worker process (the group: the driver and its worker; the conformance suite
        # runs the batch path on two): each spawned worker costs ~1.5 CPU s, twice a test
        return DaskEngine(scheduler="processes", partition_size=7, num_workers=1)
    return None  # the default: local


def run(provider: str, engine: str, base_url: str, anthropic_url: str, into: str,
        rows: str) -> dict:
    """The job: rows, pending, failed and the labels by row."""
    if provider == "openai":
        nodes, inputs = [B.oa_sync, B.label_sync], {"base_url": base_url}
    else:
        nodes, inputs = [B.claude, B.label_claude], {"anthropic_url": anthropic_url}
    texts = [f"job row {i}" for i in range(int(rows))]
    graph = Graph([*nodes, B.shout], engine=engine_of(engine))
    res = graph.map(source=pa.table({"text": texts}), inputs=inputs, into=into)
    table = res.to_arrow().sort_by("_hn_row")
    return {"rows": res.rows, "pending": res.pending, "failed": res.failed,
            "labels": table.column("label").to_pylist()}


def main(*argv: str) -> None:
    print(json.dumps(run(*argv)))


if __name__ == "__main__":
    main(*sys.argv[1:7])
