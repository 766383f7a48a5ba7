"""``DaftEngine``: ``map()`` compiled into a Daft DataFrame pipeline.

Shape of the pipeline (one ``map`` call)::

    item frame (row id + mapped inputs)  ->  one batch UDF running the whole plan
        ->  payload cells (one per Daft batch, nulls filtered out)  ->  driver: sink()

Why one UDF running the whole plan per batch, not one UDF column per node — measured with
``benchmarks/bench_daft.py`` (``udf_shape_rows``) on this 2-core machine, daft 0.7.26:

- trivial 3-node graph, 100k items: one ``daft.func`` UDF column per node (no cache, no
  events, nothing but the calls) took 3.4 s (8.1 s under load), one batch UDF calling
  ``execute_batch`` 0.58 s (0.89 s under load): each UDF column pays Daft's per-row Python
  dispatch and a materialized Python column, while ``execute_batch`` maps a sync node over
  a whole batch in one C-level ``map``;
- async I/O graph (two nodes sleeping 1 ms, 2000 items): per-node async UDFs 0.32 s, one
  batch UDF 0.31 s — both overlap the sleeps; ``execute_batch`` gathers a batch's calls;
- per-node UDFs cannot express branches, gates, ``END`` or cycles (the control-flow
  region has to run as one UDF over the shared executor anyway) and would need their own
  cache-key chaining and event plumbing — a second executor to keep identical to the
  core's. One UDF over ``execute_batch`` has the same cache keys, events, defaults,
  multi-output unpacking and error annotations as every other engine by construction.

Partitioning: on the native runner (threads of this process; ``into_partitions`` is a
no-op there) Daft cuts the frame into UDF calls of at most ``batch_size`` rows and runs
them on all its threads; on Ray the frame gets one partition per batch (at most 4 per
cluster CPU) and runs in Ray worker processes. The default batch size spreads a map over
twice as many batches as there are CPUs (at most 10 000 items each), so every thread has
work and results stream back while the rest runs. Native threads share the GIL: they
overlap I/O, async waits and GIL-releasing code; pure-Python nodes use one core. Daft's
``use_process=True`` was measured and rejected: 3.8 s vs 0.57 s (trivial, 100k) and
3.3 s vs 0.60 s (async, 4000 items) — process start-up and shipping dominate. Async
nodes of a batch run concurrently (up to ``batch_size`` calls in flight). Batch nodes
(``@node(batch_size=N)``): the UDF's batch size is rounded up to a multiple of the plan's
largest ``N``, so each Daft batch fills whole calls of the node (the last batch of a map
may end with a short one).

Inputs: ``zip`` and ``product`` are expanded by the core in the driver (one code path
defines item order and indices for every engine; a Daft cross join would not preserve
``itertools.product`` order and would need row ids recomputed afterwards). Broadcast
inputs and the ``Plan`` travel once, in the UDF's closure.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import daft
from daft import DataType, col

from hypernodes_dist.datasets.job import DatasetJob
from hypernodes_dist.datasets.report import PartReport
from hypernodes_dist.engines.base import Engine
from hypernodes_dist.engines.kit import RemoteWorkers, flow_tasks, partition_size
from hypernodes_dist.execution.batching import fit_size
from hypernodes_dist.execution.job import MapJob, Sink
from hypernodes_dist.execution.progress import ProgressChannel, Receive

from . import limits, teardown
from .ctrlc import keep_ctrl_c_in_python
from .datasets import run_dataset_native
from .frame import ROW, column_name, item_frame
from .udf import Failure, apply_udf, close, make_udf, receive

__all__ = ["DaftEngine"]

RUNNERS = ("native", "ray")


class DaftEngine(Engine):
    """Runs ``map`` as a Daft DataFrame pipeline on Daft's native runner or on Ray.

    ``runner``: ``"native"`` (multi-threaded, this process) or ``"ray"`` (Daft's Ray
    runner; ``address`` connects to an existing cluster, ``None`` starts or reuses a local
    Ray). Daft fixes its runner once per process, so one process uses one runner kind.
    ``batch_size``: items per UDF call (``None``: chosen per map from the item count and
    the CPUs). ``num_threads``: native runner threads (``None``: Daft's default).
    ``run()`` runs locally (like ``GraphEngine``); ``iter()`` is not supported.
    """

    name: ClassVar[str] = "daft"
    supports_iter: ClassVar[bool] = False
    part_rows: ClassVar[tuple[int, int]] = (10_000, 250_000)  # one Daft query per part

    def __init__(
        self,
        runner: str = "native",
        batch_size: int | None = None,
        *,
        address: str | None = None,
        num_threads: int | None = None,
        max_workers: int = 4,
    ) -> None:
        if runner not in RUNNERS:
            raise ValueError(f"DaftEngine runner must be one of {RUNNERS}, got {runner!r}")
        if runner == "ray" and importlib.util.find_spec("ray") is None:
            raise ImportError(
                "DaftEngine(runner=\"ray\") needs Ray, which is not installed: "
                "pip install 'hypernodes-dist-daft[ray]' (or 'daft[ray]')"
            )
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.runner = runner
        self.batch_size = batch_size
        self.address = address
        self.num_threads = num_threads
        self.max_workers = max_workers

    def __repr__(self) -> str:
        return f"DaftEngine(runner={self.runner!r}, batch_size={self.batch_size})"

    # ------------------------------------------------------------------ map
    def execute_map(self, job: MapJob, sink: Sink) -> None:
        self._ensure_runner()
        size = fit_size(job.plan, self._size(job.n, job.plan.flows))  # full batch-node calls
        names = tuple(job.columns)
        token = uuid.uuid4().hex
        local = self.runner == "native"
        fn = make_udf(job.plan, names, job.broadcast, job.settings, token, local)
        flows = local and job.plan.flows  # async UDF: batches in flight at once (udf.py)
        udf = daft.func.batch(
            return_dtype=DataType.binary(), batch_size=size, use_process=False if local else None,
            max_concurrency=flow_tasks(os.cpu_count() or 1, size) if flows else None,
        )(fn)
        frame = item_frame(job.columns, job.n)
        if not local:  # Ray: one partition per batch, at most a few per CPU of the cluster
            frame = frame.into_partitions(min(math.ceil(job.n / size), 4 * _ray_cpus()))
        expr = apply_udf(udf, [col(ROW), *(col(column_name(i)) for i in range(len(names)))],
                         job.plan, job.broadcast)
        cells = frame.select(expr.alias("hn")).where(col("hn").not_null())
        stopped = True
        try:
            for batch in cells.to_arrow_iter():
                for payload in batch.column(0).to_pylist():
                    outcome = receive(payload)
                    if isinstance(outcome, Failure):
                        raise outcome.error
                    for result in outcome:
                        sink(result)
            stopped = False
        finally:
            close(token, stopped, local)

    # ------------------------------------------------------------------ datasets
    def execute_dataset(self, job: DatasetJob, report: Callable[[PartReport], None]) -> None:
        """Native runner: one Daft query per part (``datasets.py``); Ray: one Ray task per
        part, which reads, computes and writes it (``on_ray.py``)."""
        self._ensure_runner()
        if self.runner == "native":
            keep_ctrl_c_in_python()  # a Ctrl-C stops the map, not Daft's query (ctrlc.py)
            run_dataset_native(job, report, self.batch_size)
        else:
            from .on_ray import run_dataset_ray  # ray is an optional extra: loaded on use

            run_dataset_ray(job, report, in_flight=2 * _ray_cpus())

    def progress_channel(self, receive: Receive) -> ProgressChannel:
        """Native: UDFs run in threads of this process; Ray: an actor of the map's own
        (``progress.py``)."""
        if self.runner != "ray":
            return super().progress_channel(receive)
        from .progress import RayMailbox  # ray is an optional extra: loaded on use

        self._ensure_runner()
        return RayMailbox(receive)

    def workers_elsewhere(self) -> RemoteWorkers | None:
        """On Ray, nodes may be other machines: the driver's cache store and ``into``
        directory are checked on each before a map."""
        if self.runner != "ray":
            return None
        from .on_ray import run_everywhere  # ray is an optional extra: loaded on use

        self._ensure_runner()
        return RemoteWorkers(run_everywhere, "Ray node")

    def driver_shared(self, key: str) -> Any | None:
        """On Ray, the workers' shared values live in the job's limits actor (``limits.py``)."""
        if self.runner != "ray":
            return None
        self._ensure_runner()
        return limits.start().shared(key)

    def close(self) -> None:
        """On Ray, every Ray worker that ran a batch of this job tears its resources down
        (``teardown.py``); then the driver's own."""
        if self.runner == "ray" and _runner_is_set() and _ray_up():
            teardown.close_workers()
        super().close()

    def dataset_part_rows(self, n: int | None) -> int:
        """``batch_size`` rows, or a quarter of the rows (``part_rows``: Daft holds a part's
        columns while it runs)."""
        return self.batch_size or super().dataset_part_rows(n)

    def _size(self, n: int, flows: bool = False) -> int:
        if self.batch_size is not None:
            return self.batch_size
        return partition_size(n, os.cpu_count() or 1, tasks_per_worker=2, flows=flows)

    def _ensure_runner(self) -> None:
        from daft.runners import get_or_infer_runner_type

        if _runner_is_set() is False:
            if self.runner == "ray":
                daft.set_runner_ray(address=self.address, noop_if_initialized=True)
            else:
                daft.set_runner_native(num_threads=self.num_threads)
        current = get_or_infer_runner_type()
        if current == "ray" == self.runner:
            limits.start()  # the job's limits actor: every Ray worker's limits
            teardown.start()  # the job's close signal (teardown.py), owned by the driver
        if current != self.runner:
            raise RuntimeError(
                f"DaftEngine(runner={self.runner!r}): this process already runs Daft on the "
                f"{current!r} runner, and Daft fixes its runner once per process; use "
                f"DaftEngine(runner={current!r}) here or run the {self.runner!r} map in "
                "another process"
            )


def _ray_cpus() -> int:
    try:
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    except Exception:  # not connected yet, or no ray: the driver's CPUs
        return os.cpu_count() or 1


def _ray_up() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _runner_is_set() -> bool | None:
    """Whether Daft's runner is locked in (``None``: this Daft cannot tell)."""
    try:
        from daft.runners import _get_runner
    except ImportError:
        return None
    return _get_runner() is not None
