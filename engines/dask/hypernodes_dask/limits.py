"""Cluster-wide node limits on ``distributed``: the policy backend for tasks on Dask workers.

The core keeps each limit per process (``hypernodes_dist.policies.limits``: units held,
calls waiting, handed from call to call) over a shared backend. Inside a ``distributed``
worker this backend replaces the machine-wide one, so a limit holds across all workers of
the cluster, on any number of machines:

- ``concurrency=N``: a ``distributed.Semaphore(max_leases=N)`` named after the node (leases
  live on the scheduler; a dead worker's leases expire after
  ``distributed.scheduler.locks.lease-timeout``). A worker only talks to the scheduler
  when it needs more units than it holds or has nobody left to hand one to: while its
  calls wait, a unit passes from a finished call to the next one inside the worker, so a
  busy worker makes no scheduler round trip per call;
- ``rate_limit``: the same reservation scheme as the machine backend (start times spaced
  ``per/count`` seconds), reserved in blocks sized to the demand, its state in the
  scheduler's metadata store (``Client.get_metadata``/``set_metadata``) updated under a
  ``distributed.Lock``. Start times are the workers' wall-clock times, so the machines'
  clocks must agree (NTP) to within the spacing you need. A metered quantity's rate
  (``rate_limit={"tokens": ...}``) is the same reservation, by amounts;
- a map's budget totals and a node's Retry-After hold-off: values in the scheduler's metadata,
  updated under a ``distributed.Lock`` (``shared``).

Registered with the core by importing ``hypernodes_dask``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from hypernodes_dist.policies.backend import LimitsBackend
from hypernodes_dist.policies.limits import register_backend

__all__ = ["DistributedLimits", "DriverShared", "probe"]


class _Semaphore:
    """A ``RemoteSemaphore``."""

    remote = True  # each operation is a scheduler round trip: the core calls it off the path

    def __init__(self, key: str, n: int) -> None:
        from distributed import Semaphore

        self.sem = Semaphore(max_leases=n, name=f"hypernodes-concurrency-{n}-{key}")

    def try_take(self) -> bool:
        return bool(self.sem.acquire(timeout=0))

    def take(self, timeout: float) -> bool:
        return bool(self.sem.acquire(timeout=timeout))

    def give(self) -> None:
        self.sem.release()


class _Rate:
    """A ``RateStore``."""

    def __init__(self, key: str, count: float, per: float) -> None:
        from distributed import Lock, get_client

        name = f"hypernodes-rate-{count:g}-{per:g}-{key}"
        self.interval = per / count
        self.lock = Lock(name)
        self.client = get_client()
        self.path = ["hypernodes-rate", name]

    def reserve(self, k: float = 1) -> float:
        """The first of ``k`` start times (wall clock) spaced ``interval`` apart."""
        with self.lock:
            tat = float(self.client.get_metadata(self.path, default=0.0))
            start = max(tat, time.time())
            self.client.set_metadata(self.path, start + k * self.interval)
        return start


class DriverShared:
    """A cluster's shared value seen from the driver (``Engine.driver_shared``): the
    scheduler's metadata, read and set from the driver's client. ``update`` takes no lock:
    the driver is the only writer of the values it updates (a map's budget answers); a task
    could not take the workers' lock while every worker thread runs a parked call."""

    def __init__(self, client: Any, key: str) -> None:
        self.client, self.key = client, key
        self.path = ["hypernodes-shared", key]

    def get(self) -> Any:
        return self.client.get_metadata(self.path, default=None)

    def update(self, change: Callable[[Any], Any]) -> Any:
        value = change(self.get())
        self.client.set_metadata(self.path, value)
        return value

    def remove(self) -> None:
        self.client.set_metadata(self.path, None)


class _Shared(DriverShared):
    """A ``SharedValue`` of the cluster as a task sees it: the same metadata through the
    worker's client, updated under a ``distributed.Lock`` (a map's budget totals, a node's
    Retry-After hold-off)."""

    def __init__(self, key: str) -> None:
        from distributed import Lock, get_client

        super().__init__(get_client(), key)
        self.lock = Lock(f"hypernodes-shared-{key}")

    def update(self, change: Callable[[Any], Any]) -> Any:
        with self.lock:
            return super().update(change)


class DistributedLimits(LimitsBackend):
    """Limits kept by the scheduler of the cluster this worker belongs to (a
    ``hypernodes_dist.policies.backend.LimitsBackend``)."""

    name = "distributed"

    def __init__(self, scheduler: str) -> None:
        self.directory = scheduler  # part of the core's limiter cache key: one per cluster

    def semaphore(self, key: str, n: int) -> _Semaphore:
        return _Semaphore(key, n)

    def rate(self, key: str, count: float, per: float) -> _Rate:
        return _Rate(key, count, per)

    def shared(self, key: str) -> _Shared:
        return _Shared(key)


def probe() -> DistributedLimits | None:
    """The backend when running inside a ``distributed`` worker, else ``None``."""
    if "distributed" not in sys.modules:
        return None
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:
        return None
    return DistributedLimits(worker.scheduler.address)


register_backend(probe)
