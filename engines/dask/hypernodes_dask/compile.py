"""Compile one ``MapJob`` into a Dask task graph: one key for what items share, one task per partition.

Graph shape (``dask.task_spec`` — ``Task``/``TaskRef``/``DataNode`` — the API every Dask
scheduler and ``distributed`` consume natively)::

    ("hn-shared-<token>",)            DataNode: Payload(plan, broadcast, settings)
    ("hn-batch-<token>", 0) ... (k-1) Task(run_partition, TaskRef(shared), offset, n, columns)

``run_partition`` runs the core's ``execute_batch`` over its slice of the mapped columns, so
the control flow of a run (branches, gates, ``END``, cycles) happens inside the task with
exactly the local engine's semantics. The task count is ``ceil(n / partition_size)``: it grows
with items / partition size, never with items x nodes.

What every task shares — the plan, the broadcast inputs and the settings (cache handle) —
exists once per map call:

- threads / sync: the ``Payload`` object itself is the shared key (no copy at all);
- processes / distributed: it is cloudpickled once in the driver into a ``Shipment``. On the
  process pool the bytes go to a temporary file and the shared key is only its path; on a
  cluster the ``Shipment`` is scattered once (replicated to every worker, so losing a worker
  does not lose it) and the graph references the future. Either way each worker process
  unpickles it once per map (``shipping.Shipment.load`` memoizes by digest).

The token is a fresh UUID per map call: map work is never deduplicated with another call's.
"""

from __future__ import annotations

import pickle
import sys
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle
from dask.task_spec import DataNode, Task, TaskRef

from hypernodes_dist.engines.kit import check_picklable, flow_tasks, unpicklable
from hypernodes_dist.errors import UnpicklableError
from hypernodes_dist.execution.batch import execute_batch
from hypernodes_dist.execution.job import BatchResult, BatchSettings, Chunk, MapJob
from hypernodes_dist.perprocess import Memo
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.limits import settle

from .packing import Packed, pack
from .shipping import Shipment, missing_module, pickled, run_there

__all__ = [
    "Payload",
    "Shipment",
    "UnpicklableError",
    "build_graph",
    "pickle_payload",
    "run_partition",
]


@dataclass
class Payload:
    """What every partition of one map shares."""

    plan: Plan
    broadcast: dict[str, Any]
    settings: BatchSettings


def pickle_payload(job: MapJob, where: str) -> Shipment:
    """The job's payload pickled once (``shipping.pickled``), or ``UnpicklableError``
    naming the culprit.

    Runs in the driver before anything is submitted. The mapped columns travel with the
    tasks, so their first item is checked too (a type that does not pickle fails early).
    """
    shipment = pickled(Payload(job.plan, job.broadcast, job.settings), where,
                       lambda: unpicklable(job.plan, job.broadcast, where))
    for name, column in job.columns.items():
        if len(column):
            check_picklable(column[0], f"input {name!r} (item 0)", where)
    return shipment


# ------------------------------------------------------------------ the task


def pack_columns(columns: dict[str, Sequence[Any]], offset: int = 0) -> bytes:
    """A partition's items as one opaque blob: schedulers, tokenizers and the process pool
    then move bytes instead of walking (and re-pickling) every item. A value that does not
    pickle raises ``UnpicklableError`` naming its input and item (``offset`` + position)."""
    try:
        return pickle.dumps(columns, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        try:
            return cloudpickle.dumps(columns)
        except Exception as exc:
            for name, column in columns.items():
                for i, value in enumerate(column):
                    check_picklable(value, f"input {name!r} (item {offset + i})",
                                    "worker processes")
            raise UnpicklableError(f"the mapped inputs cannot be sent to worker processes: {exc}"
                                   ) from exc


def run_partition(shared: Payload | Shipment, offset: int, n: int,
                  columns: dict[str, Sequence[Any]] | bytes) -> BatchResult | Packed:
    """One Dask task: items ``offset .. offset+n`` through the shared plan executor. In a
    worker process the result comes back pickled (``packing.pack``: unpicklable outputs
    fail their item, not the map) and an error is made portable (``shipping.run_there``)."""

    def work(payload: Payload) -> BatchResult:
        cols = columns
        if isinstance(cols, bytes):
            try:
                cols = pickle.loads(cols)
            except ModuleNotFoundError as exc:  # mapped values of a class only the driver has
                raise missing_module(exc) from exc
        chunk = Chunk(offset, n, cols, payload.broadcast)
        return _execute(payload.plan, chunk, payload.settings)

    return run_there(shared, work, lambda result, payload: pack(result, payload.plan,
                                                                payload.settings))


def _execute(plan: Plan, chunk: Chunk, settings: BatchSettings) -> BatchResult:
    if plan.flows and _distributed_worker() is not None:
        return _seceded(plan, chunk, settings)
    return execute_batch(plan, chunk, settings)


class _Flowing:
    """This process's flow slots, by their number, and its flowing partitions running."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slots: dict[int, threading.Semaphore] = {}
        self.running = 0


_FLOWING: Memo[_Flowing] = Memo("dask.compile.flowing")


def _distributed_worker() -> Any:
    if "distributed" not in sys.modules:
        return None
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError:
        return None


def _seceded(plan: Plan, chunk: Chunk, settings: BatchSettings) -> BatchResult:
    """A partition of a plan whose items flow, on a ``distributed`` worker: it takes one of
    the process's flow slots (``kit.flow_tasks`` of its threads, for partitions of this
    size), then leaves the worker's thread pool (``secede``), so the worker starts its next
    partition while this one's items wait: one partition ending with its slowest item does
    not idle the worker."""
    from distributed import secede

    slots = flow_tasks(_distributed_worker().state.nthreads, chunk.n)
    flowing = _FLOWING.get("here", _Flowing)
    with flowing.lock:
        if slots not in flowing.slots:
            flowing.slots[slots] = threading.Semaphore(slots)
        flowing.running += 1
    try:
        with flowing.slots[slots]:
            secede()
            return execute_batch(plan, chunk, settings)
    finally:
        with flowing.lock:
            flowing.running -= 1
            last = not flowing.running
        if last:  # the worker's last flowing partition: its idle limit units go back now
            settle()


# ------------------------------------------------------------------ the graph


def build_graph(job: MapJob, partition_size: int, shared: Any = None,
                shared_key: Any = None, pack: bool = False) -> tuple[dict[Any, Any], list[Any]]:
    """The task graph of ``job`` and its output keys (one per partition, in item order).

    ``shared`` (the payload or a ``Shipment``) becomes one ``DataNode`` key of the graph;
    alternatively ``shared_key`` names data already on the cluster (a scattered future's
    key), which the tasks then reference without embedding it. ``pack`` pickles each
    partition's items into bytes (for schedulers that serialize tasks).
    """
    token = uuid.uuid4().hex
    dsk: dict[Any, Any] = {}
    if shared_key is None:
        shared_key = (f"hn-shared-{token}",)
        dsk[shared_key] = DataNode(shared_key, shared)
    ref = TaskRef(shared_key)
    name = f"hn-batch-{token}"
    keys = []
    for i, (start, stop) in enumerate(job.bounds(partition_size)):
        key = (name, i)
        cols: Any = {k: v[start:stop] for k, v in job.columns.items()}
        if pack:
            cols = pack_columns(cols, start)
        dsk[key] = Task(key, run_partition, ref, start, stop - start, cols)
        keys.append(key)
    return dsk, keys
