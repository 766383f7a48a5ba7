"""Where Dask work runs: a distributed client (given, connected, or on a new LocalCluster)
and the persistent process pool of ``scheduler="processes"``.

Ownership rule: a resource is closed only by whoever created it. A ``Client`` passed in is
never closed; a client connected to ``address``, a ``LocalCluster`` we started, our process
pool and our temporary directory are closed by ``close()``. Everything starts lazily, on the
first map that needs it, so building a ``DaskEngine`` is free.
"""

from __future__ import annotations

import logging
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from hypernodes_dist.engines.kit import flow_tasks
from hypernodes_dist.engines.scratch import Scratch
from hypernodes_dist.resources import release_resources

from .mainguard import check_main

__all__ = ["ClientHandle", "ProcessPool"]


def release_on_workers(client: Any) -> None:
    """Every worker tears down the resources it built (``@resource``); a worker that is
    gone or does not answer within 60 s is skipped (its process end tears them down)."""
    try:
        client.run(release_resources, wait=True, on_error="ignore")
    except Exception:  # noqa: S110 - closing never fails on a lost worker
        pass


class ClientHandle:
    """A ``distributed.Client``: the given one, one connected to ``address``, or a LocalCluster's."""

    def __init__(self, client: Any = None, address: str | None = None,
                 n_workers: int | None = None, cluster_kwargs: dict[str, Any] | None = None):
        if client is not None and getattr(client, "asynchronous", False):
            raise ValueError("DaskEngine needs a synchronous distributed.Client (asynchronous=False)")
        self._client = client
        self._owns_client = client is None
        self.address = address
        self.n_workers = n_workers
        self.cluster_kwargs = dict(cluster_kwargs or {})
        self._cluster: Any = None
        self._lock = threading.Lock()

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                from distributed import Client

                if self.address is not None:
                    self._client = Client(self.address, set_as_default=False)
                else:
                    self._cluster = self._start_cluster()
                    self._client = Client(self._cluster, set_as_default=False)
            return self._client

    def _start_cluster(self) -> Any:
        import dask
        from distributed import LocalCluster

        if self.cluster_kwargs.get("processes", True):
            check_main(dask.config.get("distributed.worker.multiprocessing-method", "spawn"),
                       "the LocalCluster's worker processes")

        options: dict[str, Any] = {
            "processes": True,
            "dashboard_address": ":0",
            "silence_logs": logging.WARNING,
        }
        if self.n_workers is not None:
            options["n_workers"] = self.n_workers
        options.update(self.cluster_kwargs)
        return LocalCluster(**options)

    def workers(self) -> int:
        """Threads across the cluster's workers (at least 1)."""
        return max(1, sum(self.client().nthreads().values()))

    @property
    def started(self) -> bool:
        return self._client is not None

    def close(self) -> None:
        """Tear down the resources the workers built, then close what this handle started."""
        with self._lock:
            client, cluster = self._client, self._cluster
            if client is not None:
                release_on_workers(client)
            if self._owns_client:
                self._client, self._cluster = None, None
                if client is not None:
                    client.close()
                if cluster is not None:
                    cluster.close()


def ignore_ctrl_c() -> None:
    """A worker process ignores Ctrl-C (the terminal sends it to the whole process group):
    the driver decides what a Ctrl-C stops (a dataset map finishes and writes its steps in
    flight first)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ProcessPool:
    """The process pools kept across maps (spawning workers costs ~1 s), plus a scratch directory.

    Two pools, each started on first use: ``workers`` processes for plans that compute, and
    ``kit.flow_tasks(workers)`` processes for plans whose items flow (async calls, waiting
    policies). A process of the pool runs one partition at a time, and a flowing partition
    ends with its tail (its slowest item, e.g. one sleeping in a retry back-off) while its
    process is otherwise idle: with several processes per CPU the other partitions keep the
    limits busy during one's tail, whatever the partition size.
    """

    def __init__(self, workers: int):
        self.workers = workers
        self._pools: dict[int, ProcessPoolExecutor] = {}
        self._dir: Scratch | None = None
        self._lock = threading.Lock()

    def pool(self, flows: bool = False) -> ProcessPoolExecutor:
        from dask.multiprocessing import get_context, initialize_worker_process

        size = self._size(flows)
        with self._lock:
            pool = self._pools.get(size)
            if pool is None:
                context = get_context()
                check_main(context.get_start_method())
                pool = self._pools[size] = ProcessPoolExecutor(
                    size, mp_context=context, initializer=initialize_worker_process,
                    initargs=(ignore_ctrl_c,))
            return pool

    def broken(self, flows: bool = False) -> None:
        """The pool ``pool(flows)`` gave lost a process (``BrokenProcessPool``): it is shut
        down, and the next ``pool(flows)`` starts a new one."""
        with self._lock:
            pool = self._pools.pop(self._size(flows), None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _size(self, flows: bool) -> int:
        return flow_tasks(self.workers) if flows else self.workers

    def scratch(self) -> str:
        """The payload directory (``hypernodes-dask-<pid>-*``; stale ones of killed runs are
        removed when it is made, see ``hypernodes_dist.engines.scratch``)."""
        with self._lock:
            if self._dir is None:
                self._dir = Scratch("hypernodes-dask")
            return self._dir.path

    def close(self) -> None:
        with self._lock:
            pools, directory = list(self._pools.values()), self._dir
            self._pools, self._dir = {}, None
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
        if directory is not None:
            directory.close()
