"""Dataset maps on Dask: one task per part; the task reads the part and runs it through the
core's part pipeline (``PartTask.run``: steps, a file of its finished rows every
``commit_seconds`` or at its end), and returns a ``PartReport`` (counts, not rows).

- What the parts share (the ``PartTask``: plan, broadcast inputs, schema, output directory)
  travels once, by the engine's one shipping path (``shipping.py``): the object itself on
  threads/sync, a ``Shipment`` file on the process pool, a ``Shipment`` scattered to every
  worker on ``distributed``.
- Parquet parts carry only file names, row groups and row ranges: the workers read them.
  In-memory sources (an Arrow table, a pandas frame, dict inputs) and streams carry their
  rows; streams are submitted in windows, so the driver holds a few parts at a time.
- A ``dask.dataframe.DataFrame`` source: its partitions are computed on the workers and
  consumed there by the part tasks (one part per Dask partition).
- ``distributed``: before anything runs, every worker checks it sees the ``into``
  directory (a marker file); one that does not is named in the error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import islice
from typing import Any, Protocol

from dask.task_spec import DataNode, Task, TaskRef

from hypernodes_dist.datasets import DatasetJob, Part, PartReport, PartTask
from hypernodes_dist.datasets.parts import PandasReader
from hypernodes_dist.datasets.source import DaskSource
from hypernodes_dist.engines.kit import unpicklable
from hypernodes_dist.errors import NodeError

from .cluster import ProcessPool
from .local import compute_local
from .shipping import InFlight, Shipment, on_cluster, on_processes, pickled, run_there

__all__ = ["run_dataset_distributed", "run_dataset_local"]

Report = Callable[[PartReport], None]
PART_KEY = "hn-dataset-part"


class DaskEngine(Protocol):
    """What the dataset path uses of a ``DaskEngine`` (``engine.py`` passes itself)."""

    scheduler: str
    num_workers: int | None

    @property
    def processes(self) -> ProcessPool | None: ...
    @property
    def client(self) -> Any: ...
    def workers(self) -> int: ...


def _shipment(task: PartTask, where: str) -> Shipment:
    return pickled(task, where, lambda: unpicklable(task.plan, task.broadcast, where))


def run_part(shared: PartTask | Shipment, part: Part, frame: Any = None) -> PartReport:
    """One Dask task: read, compute and write one part (``frame``: a Dask partition), in
    the core's part pipeline (``PartTask.run``: files by ``commit_seconds``)."""

    def work(task: PartTask) -> PartReport:
        if frame is None:
            return task.run(part)
        data = PandasReader(frame).read(task.read_columns)
        at = replace(part, n=len(frame), reader=None)
        return task.run(at, data=data)

    return run_there(shared, work)


def _windows(job: DatasetJob, size: int) -> Iterator[list[Part]]:
    parts = job.pending()
    if job.source.kind in ("parquet", "table", "pandas", "lists"):
        yield list(parts)  # descriptors, or rows the driver holds anyway
        return
    while True:
        window = list(islice(parts, size))
        if not window:
            return
        yield window


# ------------------------------------------------------------------ local schedulers


def run_dataset_local(engine: DaskEngine, job: DatasetJob, report: Report) -> None:
    """Threads / processes / sync: one graph per window of parts, reports as tasks end."""
    with on_processes(engine.processes, job.task,
                      lambda: _shipment(job.task, "worker processes")) as shared:
        for dsk, keys in _graphs(engine, job, shared):
            compute_local(engine, dsk, keys, report, threads=engine.num_workers,
                          died=_died)


def _died(running: list[Any]) -> NodeError:
    parts = sorted(k[1] for k in running if isinstance(k, tuple) and k[0] == PART_KEY)
    return NodeError(
        f"a Dask worker process died running part(s) {parts} of the dataset map (killed, "
        "os._exit, segfault or out of memory); every file already written is kept: rerun "
        "the same map to continue", "BrokenProcessPool")
def _graphs(engine: DaskEngine, job: DatasetJob, shared: Any) -> Iterator[tuple[dict, list]]:
    skey = ("hn-dataset-shared",)
    if isinstance(job.source, DaskSource):
        delayed = job.source.frame.to_delayed()
        dsk = {}
        for d in delayed[:1]:  # the partitions share one graph
            dsk.update(d.__dask_graph__())
        dsk[skey] = DataNode(skey, shared)
        keys = []
        for part in _dask_parts(job, engine):
            key = (PART_KEY, part.index)
            dsk[key] = Task(key, run_part, TaskRef(skey), part, TaskRef(delayed[part.index].key))
            keys.append(key)
        yield dsk, keys
        return
    for window in _windows(job, 4 * engine.workers()):
        dsk = {skey: DataNode(skey, shared)}
        keys = []
        for part in window:
            key = (PART_KEY, part.index)
            dsk[key] = Task(key, run_part, TaskRef(skey), part)
            keys.append(key)
        yield dsk, keys


def _dask_parts(job: DatasetJob, engine: DaskEngine) -> list[Part]:
    """One part per Dask partition (from its first row not in a file), with offsets from
    a length pass run on the workers."""
    assert isinstance(job.source, DaskSource)
    lengths = job.source.frame.map_partitions(len)
    if engine.scheduler == "distributed":
        counts = engine.client.compute(lengths).result()
    else:
        counts = lengths.compute(scheduler="sync" if engine.scheduler == "sync" else "threads")
    parts, offset = [], 0
    for i, n in enumerate(int(x) for x in counts):
        todo = job.resume(Part(i, offset, n, None))
        if todo is not None:
            parts.append(todo)
        offset += n
    job.source.set_rows(offset)
    return parts


# ------------------------------------------------------------------ distributed


def run_dataset_distributed(engine: DaskEngine, job: DatasetJob, report: Report) -> None:
    """One future per part, at most a window of them in flight (a stream source is read as
    parts finish); the rest are cancelled on an error."""
    client = engine.client
    stop = job.task.stop
    with on_cluster(client, _shipment(job.task, "Dask workers")) as shared, \
            InFlight(client) as in_flight:
        if isinstance(job.source, DaskSource):
            frames = client.compute(job.source.frame.to_delayed())
            for p in _dask_parts(job, engine):
                in_flight.add(client.submit(run_part, shared, p, frames[p.index], pure=False))
            del frames
            for _, result in in_flight:
                report(result)
            return
        parts = job.pending()
        for part in islice(parts, 4 * engine.workers()):
            in_flight.add(client.submit(run_part, shared, part, pure=False))
        for _, result in in_flight:
            report(result)
            if stop is not None and stop.stopped():
                continue  # the parts in flight end after their step; no new one starts
            for part in islice(parts, 1):  # keep the window full
                in_flight.add(client.submit(run_part, shared, part, pure=False))
