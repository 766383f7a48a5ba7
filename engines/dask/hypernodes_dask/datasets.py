"""Dataset maps on Dask: one task per part; the task reads the part, runs the plan, writes the
part's Parquet file and returns a ``PartReport`` (counts, not rows).

- What the parts share (the ``PartTask``: plan, broadcast inputs, schema, output directory)
  travels once: the object itself on threads/sync, a ``Shipment`` file on the process pool,
  a ``Shipment`` scattered to every worker on ``distributed``.
- Parquet parts carry only file names, row groups and row ranges: the workers read them.
  In-memory sources (an Arrow table, a pandas frame, dict inputs) and streams carry their
  rows; streams are submitted in windows, so the driver holds a few parts at a time.
- A ``dask.dataframe.DataFrame`` source: its partitions are computed on the workers and
  consumed there by the part tasks (one part per Dask partition).
- ``distributed``: before anything runs, every worker checks it sees the ``into``
  directory (a marker file); one that does not is named in the error.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures.process import BrokenProcessPool
from itertools import islice
from typing import Any

import cloudpickle
from dask.task_spec import DataNode, Task, TaskRef

from hypernodes_dist.datasets import DatasetJob, Part, PartReport, PartTask
from hypernodes_dist.datasets.parts import PandasReader
from hypernodes_dist.engines.kit import unpicklable
from hypernodes_dist.errors import NodeError, UnpicklableError, call_portably

from .compile import Shipment, write_shipment
from .local import compute_local, running_keys

__all__ = ["run_dataset_distributed", "run_dataset_local"]

Report = Callable[[PartReport], None]
PART_KEY = "hn-dataset-part"


def _ship(task: PartTask, where: str) -> tuple[bytes, str]:
    try:
        data = cloudpickle.dumps(task)
    except Exception as exc:
        raise unpicklable(task.plan, task.broadcast, where) or UnpicklableError(
            f"the map cannot be sent to {where}: {exc}") from exc
    return data, hashlib.blake2b(data, digest_size=16).hexdigest()


def run_part(shared: PartTask | Shipment, part: Part, frame: Any = None) -> PartReport:
    """One Dask task: read, compute and write one part (``frame``: a Dask partition)."""
    remote = isinstance(shared, Shipment)
    task: PartTask = shared.load() if remote else shared  # type: ignore[assignment]

    def run() -> PartReport:
        data, at = None, part
        if frame is not None:
            data = PandasReader(frame).read(task.read_columns)
            at = Part(part.index, part.offset, len(frame), None)
        return task.run(at, data=data)

    return call_portably(run) if remote else run()


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


def run_dataset_local(engine: Any, job: DatasetJob, report: Report) -> None:
    """Threads / processes / sync: one graph per window of parts, reports as tasks end."""
    if engine._processes is not None:
        data, digest = _ship(job.task, "worker processes")
        shared: Any = write_shipment(data, digest, engine._processes.scratch())
    else:
        shared = job.task
    try:
        for dsk, keys in _graphs(engine, job, shared):
            compute_local(engine, dsk, keys, report, threads=engine.num_workers)
    except BrokenProcessPool as exc:  # a worker died (signal, os._exit, out of memory)
        parts = sorted(k[1] for k in running_keys(exc) if isinstance(k, tuple) and k[0] == PART_KEY)
        raise NodeError(
            f"a Dask worker process died running part(s) {parts} of the dataset map (killed, "
            "os._exit, segfault or out of memory); every part already written is kept: "
            "rerun the same map to continue", "BrokenProcessPool") from exc
    finally:
        if isinstance(shared, Shipment) and shared.path:
            with contextlib.suppress(OSError):
                os.unlink(shared.path)


def _graphs(engine: Any, job: DatasetJob, shared: Any) -> Iterator[tuple[dict, list]]:
    skey = ("hn-dataset-shared",)
    if job.source.kind == "dask":
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


def _dask_parts(job: DatasetJob, engine: Any) -> list[Part]:
    """One part per Dask partition, with offsets from a length pass run on the workers."""
    lengths = job.source.frame.map_partitions(len)
    if engine.scheduler == "distributed":
        counts = engine.client.compute(lengths).result()
    else:
        counts = lengths.compute(scheduler="sync" if engine.scheduler == "sync" else "threads")
    parts, offset = [], 0
    for i, n in enumerate(int(x) for x in counts):
        if i not in job.skip:
            parts.append(Part(i, offset, n, None))
        offset += n
    job.source.n = offset
    return parts


# ------------------------------------------------------------------ distributed


def run_dataset_distributed(engine: Any, job: DatasetJob, report: Report) -> None:
    from distributed import as_completed

    client = engine.client
    data, digest = _ship(job.task, "Dask workers")
    [shared] = client.scatter([Shipment(digest, data=data)], broadcast=True, hash=False)
    pending: dict[str, Any] = {}
    try:
        if job.source.kind == "dask":
            frames = client.compute(job.source.frame.to_delayed())
            futures = [client.submit(run_part, shared, p, frames[p.index], pure=False)
                       for p in _dask_parts(job, engine)]
            del frames
            pending.update((f.key, f) for f in futures)
            for future, result in as_completed(futures, loop=client.loop, with_results=True):
                del pending[future.key]
                report(result)
            return
        window = 4 * engine.workers()
        parts = job.pending()
        done = as_completed(loop=client.loop, with_results=True)
        for part in islice(parts, window):
            f = client.submit(run_part, shared, part, pure=False)
            pending[f.key] = f
            done.add(f)
        for future, result in done:
            del pending[future.key]
            report(result)
            for part in islice(parts, 1):  # keep the window full
                f = client.submit(run_part, shared, part, pure=False)
                pending[f.key] = f
                done.add(f)
    finally:
        if pending:
            client.cancel(list(pending.values()))
        client.cancel([shared])
