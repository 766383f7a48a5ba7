"""The engine interface: an engine only decides *where* batches of a map run.

It receives a ``MapJob``, cuts it into chunks, runs ``execute_batch`` (the shared plan
executor) on each chunk wherever it likes, and hands every ``BatchResult`` to ``sink`` in
the driver as it completes, in any order. Everything else — input expansion, ids, cache
keys, result assembly, events, progress, error policy — is the core's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from hypernodes_dist.cache.base import Cache
from hypernodes_dist.engines.kit import (
    RemoteWorkers,
    check_cache_seen,
    check_output_seen,
    partition_size,
)
from hypernodes_dist.execution.job import MapJob, Sink
from hypernodes_dist.execution.progress import LocalChannel, ProgressChannel, Receive
from hypernodes_dist.resources import release_resources

if TYPE_CHECKING:  # pyarrow loads only for dataset maps
    from hypernodes_dist.datasets.job import DatasetJob
    from hypernodes_dist.datasets.report import PartReport
    from hypernodes_dist.sinks.parquet import ParquetDataset

__all__ = ["Engine"]


class Engine:
    """Base class of engines. Subclasses implement ``execute_map``."""

    name: ClassVar[str] = "engine"
    supports_iter: ClassVar[bool] = False
    parallel_nodes: bool = False
    max_workers: int = 4
    part_rows: ClassVar[tuple[int, int]] = (1_000, 100_000)  # a dataset part's rows: least, most

    def execute_map(self, job: MapJob, sink: Sink) -> None:
        """Run every item of ``job``; call ``sink`` with each ``BatchResult`` in the driver."""
        raise NotImplementedError(f"{type(self).__name__} does not implement execute_map")

    def execute_dataset(self, job: DatasetJob, report: Callable[[PartReport], None]) -> None:
        """Run every pending part of a dataset map: each part is read, computed and written
        where it runs, through the core's part pipeline (``PartTask.run(part)`` on a
        worker, ``job.run_here`` in this process), which commits its rows to files by
        time (``commit_seconds``); ``report`` receives the ``PartReport``s in the driver.
        Default: the parts one after another, here."""
        job.run_here(report)

    def progress_channel(self, receive: Receive) -> ProgressChannel:
        """How rows finished where they run reach the driver while a map runs
        (``execution/progress.py``): ``receive`` gets ``{batch offset: rows done}`` dicts.
        Default: in this process (batches run in its threads); an engine whose batches run
        in other processes returns a channel that reaches them (``engines/channels.py``:
        this machine; its own means on a cluster)."""
        return LocalChannel(receive)

    def dataset_workers(self) -> int:
        """Parts that run at once (sizes the parts of a dataset map)."""
        return 1

    def dataset_part_rows(self, n: int | None) -> int:
        """Rows per part (one output file each) of a dataset map over ``n`` rows: about 4
        parts per worker, ``part_rows`` bounding them (a stream of unknown length: the most)."""
        least, most = self.part_rows
        if not n:
            return most
        return max(least, partition_size(n, self.dataset_workers(), 4, max_size=most))

    def workers_elsewhere(self) -> RemoteWorkers | None:
        """How to call a function once on every worker, when workers may run on other
        machines (``kit.RemoteWorkers``: e.g. Dask's ``client.run``, "Dask worker").
        ``None`` (the default): every worker runs on this machine, so ``check_cache`` and
        ``check_output`` have nothing to check."""
        return None

    def driver_shared(self, key: str) -> Any | None:
        """From the driver, the limits backend's shared value ``key`` as the engine's workers
        see it (a map's budget answers, ``map(on_budget=)``); ``None`` (the default): the
        one the driver's own backend holds (every process of this machine)."""
        return None

    def check_cache(self, cache: Cache) -> None:
        """Before a map: raise ``CacheNotVisibleError`` if a worker cannot see ``cache``
        (``cache.check_visible(worker)`` on every worker ``workers_elsewhere`` reaches). A
        cache still checks lazily in each worker process."""
        elsewhere = self.workers_elsewhere()
        if elsewhere is not None:
            check_cache_seen(cache, elsewhere.run_everywhere, elsewhere.called)

    def check_output(self, out: ParquetDataset) -> None:
        """Before a dataset map runs anything: raise ``ValueError`` naming the workers that
        cannot see the ``into`` directory (``sinks.parquet.ParquetDataset``, created), on
        every worker ``workers_elsewhere`` reaches."""
        elsewhere = self.workers_elsewhere()
        if elsewhere is not None:
            check_output_seen(out, elsewhere.run_everywhere, elsewhere.called)

    def close(self) -> None:
        """Release what the engine started (clusters, pools) and tear down the resources
        (``@resource``) this process built. Idempotent; subclasses call ``super().close()``."""
        release_resources()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
