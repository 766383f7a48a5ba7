"""``DaskEngine``: ``map()`` as a batched Dask task graph on any Dask scheduler.

One task runs the core's plan executor over one partition of items (see ``compile.py`` for
the graph shape). Results reach ``sink`` in the driver as partitions finish, so progress bars
and callbacks move while the map runs:

- ``"distributed"``: the graph is submitted once (``Client.get(..., sync=False)``: one
  scheduler message, not one per task) and ``distributed.as_completed`` feeds ``sink``.
  Tasks are plain graph tasks with their data embedded, so the scheduler can recompute any
  partition lost with a worker; the shared payload is scattered to every worker.
- ``"threads"`` / ``"processes"`` / ``"sync"``: the graph is computed with
  ``dask.threaded.get`` / ``dask.multiprocessing.get`` / ``dask.local.get_sync`` and a
  ``posttask`` callback hands each finished partition to ``sink``. ``get_async`` runs its
  callbacks in the calling thread, so ``sink`` is called in the driver with no extra
  threads, and waves or polling are unnecessary. The process pool is kept across maps.

Partition size, when not given: ``ceil(n / (workers * tasks_per_worker))`` clamped to
``[1, max_partition_size]``. About ``tasks_per_worker`` (4) tasks per worker balance uneven
items and keep a progress bar moving, while the per-task cost (~0.1 ms on threads, ~1-2 ms on
processes and ``distributed``) stays amortized over many items; the cap bounds the memory of
one task and the work redone when a worker dies. Plans whose items flow (async calls,
waiting policies) get one task per worker (``engines/kit.py`` says why).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from dask.task_spec import DataNode, Task, TaskRef

from hypernodes_dist.datasets.job import DatasetJob
from hypernodes_dist.datasets.report import PartReport
from hypernodes_dist.engines.base import Engine
from hypernodes_dist.engines.channels import MachineChannel
from hypernodes_dist.engines.kit import RemoteWorkers, flow_tasks, partition_size
from hypernodes_dist.errors import NodeError
from hypernodes_dist.execution.job import MapJob, Sink
from hypernodes_dist.execution.progress import ProgressChannel, Receive

from .cluster import ClientHandle, ProcessPool
from .compile import Payload, build_graph, pack_columns, pickle_payload, run_partition
from .datasets import run_dataset_distributed, run_dataset_local
from .limits import DriverShared
from .local import compute_local
from .packing import unpack
from .progress import WorkerEvents
from .shipping import InFlight, Shipment, on_cluster, on_processes

__all__ = ["DaskEngine", "auto_partition_size"]

SCHEDULERS = ("threads", "processes", "sync", "distributed")


auto_partition_size = partition_size  # the shared rule (hypernodes_dist.engines.kit)


def _address(given: str, address: str | None) -> str:
    """A scheduler address given positionally or as ``scheduler=``; conflicts are errors."""
    if address is not None and address != given:
        raise ValueError(f"DaskEngine got two scheduler addresses: {given!r} and {address!r}")
    return given


def _cpu_count() -> int:
    from dask.system import CPU_COUNT

    return CPU_COUNT


class DaskEngine(Engine):
    """Run ``map`` as a Dask task graph: one task per partition of items.

    ``scheduler`` is ``"threads"``, ``"processes"``, ``"sync"`` or ``"distributed"``. Passing
    ``client`` (an existing ``distributed.Client``, never closed by the engine) or ``address``
    (a scheduler to connect to) implies ``"distributed"``; an address string given as
    ``client`` (``DaskEngine("tcp://host:8786")``) or as ``scheduler`` (any ``"...://..."``)
    is taken as ``address``. ``"distributed"`` with neither starts
    a ``LocalCluster`` (``num_workers`` workers, plus ``cluster_kwargs``) on first use.
    ``num_workers`` also sizes the thread / process pool. ``partition_size`` fixes the items per
    task (default: automatic, see the module docstring). ``run()`` executes in the driver;
    ``iter()`` is not supported.
    """

    name: ClassVar[str] = "dask"
    supports_iter: ClassVar[bool] = False

    def __init__(
        self,
        client: Any = None,
        address: str | None = None,
        scheduler: str = "threads",
        partition_size: int | None = None,
        *,
        num_workers: int | None = None,
        tasks_per_worker: int = 4,
        max_partition_size: int = 10_000,
        cluster_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(client, str):  # DaskEngine("tcp://host:8786"), like distributed.Client
            if client in SCHEDULERS:
                raise ValueError(
                    f"DaskEngine({client!r}): the first argument is a client or an address; "
                    f"pass scheduler={client!r}, or address=\"tcp://host:8786\" for a cluster")
            client, address = None, _address(client, address)
        if "://" in scheduler:  # a scheduler address where a scheduler kind was expected
            scheduler, address = "distributed", _address(scheduler, address)
        if client is not None and address is not None:
            raise ValueError("DaskEngine takes a client or an address, not both")
        if client is not None or address is not None:
            scheduler = "distributed"
        if scheduler not in SCHEDULERS:
            raise ValueError(
                f"unknown Dask scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)} "
                "(a cluster's address goes to address=\"tcp://host:8786\")"
            )
        for label, value in (("partition_size", partition_size), ("num_workers", num_workers)):
            if value is not None and value < 1:
                raise ValueError(f"{label} must be >= 1, got {value}")
        if tasks_per_worker < 1 or max_partition_size < 1:
            raise ValueError("tasks_per_worker and max_partition_size must be >= 1")
        self.scheduler = scheduler
        self.address = address  # the scheduler address it was given (None: none given)
        self.partition_size = partition_size
        self.num_workers = num_workers
        self.tasks_per_worker = tasks_per_worker
        self.max_partition_size = max_partition_size
        self.parallel_nodes = False
        self._cluster = (
            ClientHandle(client, address, num_workers, cluster_kwargs)
            if scheduler == "distributed" else None
        )
        self._processes = (
            ProcessPool(num_workers or _cpu_count()) if scheduler == "processes" else None
        )

    # ------------------------------------------------------------------ resources
    @property
    def client(self) -> Any:
        """The ``distributed.Client`` (started on first use); ``None`` on local schedulers."""
        return self._cluster.client() if self._cluster is not None else None

    @property
    def processes(self) -> ProcessPool | None:
        """The process pool kept across maps (``scheduler="processes"``; None otherwise)."""
        return self._processes

    @property
    def max_workers(self) -> int:  # type: ignore[override]  # a property over the base class's attribute
        return self.num_workers or _cpu_count()

    def workers(self) -> int:
        """Parallel workers the partitions spread over (cluster threads, pool size, or 1)."""
        if self._cluster is not None:
            return self._cluster.workers()
        if self.scheduler == "sync":
            return 1
        return self.num_workers or _cpu_count()

    def partition_size_for(self, n: int, flows: bool = False) -> int:
        """Items per task (``flows``: a plan whose items flow, see ``kit.partition_size``)."""
        if self.partition_size is not None:
            return self.partition_size
        return partition_size(n, self.workers(), self.tasks_per_worker, self.max_partition_size,
                              flows)

    def _threads(self, job: MapJob, size: int) -> int | None:
        """Threads of the ``"threads"`` scheduler: for a plan whose items flow, several
        partitions of ``size`` items per CPU at once (``kit.flow_tasks``): they mostly
        wait, and one ending with its slowest item does not leave the limits idle."""
        if not job.plan.flows:
            return self.num_workers
        return max(self.num_workers or 1, flow_tasks(self.num_workers or _cpu_count(), size))

    def close(self) -> None:
        """Workers tear their resources down; what the engine started stops."""
        if self._cluster is not None:
            self._cluster.close()
        if self._processes is not None:
            self._processes.close()
        super().close()

    def __repr__(self) -> str:
        address = f"address={self.address!r}, " if self.address is not None else ""
        return (f"DaskEngine({address}scheduler={self.scheduler!r}, "
                f"partition_size={self.partition_size}, num_workers={self.num_workers})")

    def progress_channel(self, receive: Receive) -> ProgressChannel:
        """Threads / sync: in this process; processes: this machine's channel;
        ``distributed``: worker events the client subscribes to (``progress.py``)."""
        if self.scheduler == "distributed":
            return WorkerEvents(self.client, receive)
        if self.scheduler == "processes":
            return MachineChannel(receive)
        return super().progress_channel(receive)

    # ------------------------------------------------------------------ datasets
    def execute_dataset(self, job: DatasetJob, report: Callable[[PartReport], None]) -> None:
        """One task per part: it reads, computes and writes its part (``datasets.py``)."""
        if self.scheduler == "distributed":
            run_dataset_distributed(self, job, report)
        else:
            run_dataset_local(self, job, report)

    def dataset_workers(self) -> int:
        return self.workers()

    def dataset_part_rows(self, n: int | None) -> int:
        return self.partition_size or super().dataset_part_rows(n)

    # ------------------------------------------------------------------ map
    def workers_elsewhere(self) -> RemoteWorkers | None:
        """On a cluster, workers may run on other machines: the driver's cache store and
        ``into`` directory are checked on each (``client.run``) before a map."""
        if self.scheduler == "distributed":
            return RemoteWorkers(self._run_everywhere, "Dask worker")
        return None

    def driver_shared(self, key: str) -> Any | None:
        """On a cluster, the workers' shared values live in the scheduler."""
        if self.scheduler == "distributed":
            return DriverShared(self.client, key)
        return None

    def _run_everywhere(self, fn: Callable[..., Any], arg: Any) -> dict[str, Any]:
        """``fn(arg, worker)`` on every worker of the cluster, by worker address and name."""
        client = self.client
        names = {a: w.get("name") for a, w in
                 client.scheduler_info(n_workers=-1)["workers"].items()}
        return {f"{a} (name {names.get(a)!r})": r
                for a, r in client.run(_on_worker, fn, arg).items()}

    def execute_map(self, job: MapJob, sink: Sink) -> None:
        if self.scheduler == "distributed":
            self._map_distributed(job, sink)
        else:
            self._map_local(job, sink)

    def _map_distributed(self, job: MapJob, sink: Sink) -> None:
        import asyncio
        import concurrent.futures

        from distributed import KilledWorker

        cancelled = (concurrent.futures.CancelledError, asyncio.CancelledError)

        shipment = pickle_payload(job, "Dask workers")  # fails before any submission
        client = self.client
        size = self.partition_size_for(job.n, job.plan.flows)
        lost: dict[tuple[int, int], int] = {}
        with on_cluster(client, shipment) as shared, InFlight(client) as in_flight:
            dsk, keys = build_graph(job, size, shared_key=shared.key, pack=True)
            futures = client.get(dsk, keys, sync=False)
            for i, span in enumerate(job.bounds(size)):
                in_flight.add(futures[i], span)
            del futures  # each partition is released on the cluster once the driver holds it
            try:
                for span, batch in in_flight:
                    if isinstance(batch, cancelled):
                        # not cancelled by us: the partition's result (or the scattered
                        # payload) died with a worker and the scheduler forgot the key; run
                        # it again, self-contained (its own copy of the payload)
                        lost[span] = lost.get(span, 0) + 1
                        if lost[span] > _MAX_RESUBMITS:
                            raise _worker_died(job, [span], f"the result was lost {lost[span]} "
                                               f"times with its Dask worker ({batch})")
                        in_flight.add(_resubmit(client, job, span, shipment), span)
                        continue
                    sink(unpack(batch))
            except KilledWorker as exc:  # the partition killed every worker that ran it
                killed = in_flight.tags.get(exc.task)
                how = f"Dask worker processes died {exc.allowed_failures + 1} times"
                raise _worker_died(job, [killed] if killed else [], how) from exc

    def _map_local(self, job: MapJob, sink: Sink) -> None:
        size = self.partition_size_for(job.n, job.plan.flows)
        payload = Payload(job.plan, job.broadcast, job.settings)
        with on_processes(self.processes, payload,
                          lambda: pickle_payload(job, "worker processes")) as shared:
            dsk, keys = build_graph(job, size, shared=shared, pack=shared is not payload)
            spans = dict(zip(keys, job.bounds(size)))
            compute_local(self, dsk, keys, lambda result: sink(unpack(result)),
                          flows=job.plan.flows, threads=self._threads(job, size),
                          died=lambda running: _worker_died(
                              job, [spans[k] for k in running if k in spans],
                              "a Dask worker process died"))


def _on_worker(fn: Callable[..., Any], arg: Any, dask_worker: Any = None) -> Any:
    """Runs on one Dask worker (``client.run``): ``fn(arg, its address)``."""
    return fn(arg, getattr(dask_worker, "address", None))


_MAX_RESUBMITS = 5  # a partition whose result is lost more often than this fails the map


def _resubmit(client: Any, job: MapJob, span: tuple[int, int], shipment: Shipment) -> Any:
    """One partition as a self-contained graph (payload included): its future."""
    start, stop = span
    token = uuid.uuid4().hex
    skey, key = (f"hn-shared-{token}",), (f"hn-batch-{token}", start)
    cols = pack_columns({k: v[start:stop] for k, v in job.columns.items()}, start)
    dsk = {skey: DataNode(skey, shipment),
           key: Task(key, run_partition, TaskRef(skey), start, stop - start, cols)}
    [future] = client.get(dsk, [key], sync=False)
    return future


def _worker_died(job: MapJob, spans: list[tuple[int, int]], how: str) -> NodeError:
    """A worker process that died (signal, ``os._exit``, segfault, OOM killer) raised nothing
    the executor could annotate: name what the driver knows, the items of the partitions it
    was running (``spans``) and the nodes of the plan."""
    spans = sorted(spans) or [(0, job.n)]
    nodes = [n.name for n in job.plan.nodes]
    items = " or ".join(f"item {a}" if b - a == 1 else f"items {a}..{b - 1}" for a, b in spans)
    where = f"node {nodes[0]!r}" if len(nodes) == 1 else (
        "one of the nodes " + ", ".join(map(repr, nodes)))
    error = NodeError(
        f"{how} running {items} (in {where}): the process was killed (signal, os._exit, "
        "segfault or out of memory) and raised no exception; rerun those items with "
        "partition_size=1 to isolate the item", "KilledWorker")
    error.__notes__ = [f"hypernodes: failed in {where} ({items})"]
    single = len(spans) == 1 and spans[0][1] - spans[0][0] == 1
    error.hn_node = nodes[0] if len(nodes) == 1 else None  # type: ignore[attr-defined]  # hn_* annotations go on any exception instance
    error.hn_item = spans[0][0] if single else None  # type: ignore[attr-defined]  # hn_* annotations go on any exception instance
    error.hn_items = [i for a, b in spans for i in range(a, b)]  # type: ignore[attr-defined]  # hn_* annotations go on any exception instance
    return error
