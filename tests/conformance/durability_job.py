"""The driver process of ``test_dataset_durability.py``'s SIGKILL cases:
``python -m tests.conformance.durability_job ENGINE_ID SOURCE INTO LOG_DIR CASE`` runs one
dataset map into ``INTO`` and prints ``rows=N`` when done. It imports only the engine it
runs: the test module imports every engine and the API clients, ~1 CPU s more in each of
the two driver processes of a case."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from hypernodes_dist import Graph, GraphEngine
from hypernodes_dist.engines.base import Engine

from . import dataset_graphs as D


@dataclass(frozen=True)
class Killed:
    """One SIGKILL case: the rows, how long each takes, the map's ``commit_seconds``, and
    whether rows are concurrent async calls (as paid API calls are)."""

    n: int
    delay: float
    commit: float
    calls: bool = False

    @property
    def node(self):
        return D.timed_call if self.calls else D.timed_square


def one_part() -> Engine:
    """Dask processes with one part, committed by time inside a Dask worker process (the
    fixture's Dask variants have 7-row parts)."""
    from hypernodes_dask import DaskEngine  # an optional plugin: only where a case runs it

    return DaskEngine(scheduler="processes", num_workers=2)


def engine_of(engine_id: str) -> Engine:
    """The ``engine`` fixture's variant ``engine_id`` (or ``dask-processes-one-part``)."""
    if engine_id == "local":
        return GraphEngine()
    if engine_id == "dask-processes-one-part":
        return one_part()
    if engine_id.startswith("dask"):
        from .engines_dask import ENGINES
    else:
        from .engines_daft import ENGINES
    return dict(ENGINES)[engine_id]()


def run(engine_id: str, source: str, into: str, log_dir: str, case: Killed) -> int:
    """The map; its rows (the tests' reruns on engines that start no process call this in
    their own process)."""
    engine = engine_of(engine_id)
    try:
        return Graph([case.node], engine=engine).map(
            source=source, inputs={"log_dir": log_dir, "delay": case.delay}, into=into,
            commit_seconds=case.commit).rows
    finally:
        engine.close()


def main(argv: list[str]) -> None:
    engine_id, source, into, log_dir, case_json = argv
    rows = run(engine_id, source, into, log_dir, Killed(**json.loads(case_json)))
    print(f"rows={rows}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
