"""Limits for Daft on Ray: one named Ray actor keeps them for every process of the job.

Daft on Ray runs a map's batches in Ray worker processes on any node of the cluster. When
a ``DaftEngine(runner="ray")`` starts, the driver creates ``LimitsActor`` (named after the
Ray job, in the ``hypernodes`` namespace, owned by the driver: it lives as long as the job)
and installs ``RayLimits`` over it; a Ray worker of that job finds it by name (``probe``,
registered with the core when ``hypernodes_daft`` is imported), so a node's
``concurrency``, rate limits, a map's budget, Retry-After hold-offs and the shared AIMD
back-off hold across every node, as the ``distributed`` backend does on Dask:

- ``concurrency=N``: ``N`` units in the actor, taken and given by round trips (a
  ``RemoteSemaphore``: the core calls it from a lease thread only, and a unit passes from
  call to call inside a worker without a round trip); a waiting ``take`` sleeps in the
  actor's event loop, FIFO, up to its timeout;
- ``rate_limit``: start times reserved in the actor (the GCRA reservation of the other
  backends), on the workers' wall clocks (the nodes' clocks must agree, NTP);
- shared values (budget totals, hold-offs, the back-off's width): versioned in the actor,
  updated by compare-and-set (``change`` runs in the worker, retried on a conflict).

Units a worker process held when it died stay taken until the job ends (the actor cannot
see Ray processes die); Ray restarts no worker mid-map in normal runs.
"""

from __future__ import annotations

import asyncio
import copy
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from hypernodes_dist.perprocess import Table
from hypernodes_dist.policies.backend import LimitsBackend
from hypernodes_dist.policies.limits import register_backend

__all__ = ["LimitsActor", "RayLimits", "start", "stop", "probe", "NAMESPACE"]

NAMESPACE = "hypernodes"


def actor_name(job_id: str) -> str:
    return f"hypernodes-limits-{job_id}"


class LimitsActor:
    """The state of every limit of one Ray job (an async actor: one event loop, no locks)."""

    def __init__(self) -> None:
        self.free: dict[str, int] = {}
        self.queues: dict[str, deque[asyncio.Future[bool]]] = {}
        self.tat: dict[str, float] = {}
        self.values: dict[str, tuple[int, Any]] = {}

    async def try_take(self, key: str, n: int) -> bool:
        free = self.free.setdefault(key, n)
        if free > 0 and not self.queues.get(key):
            self.free[key] = free - 1
            return True
        return False

    async def take(self, key: str, n: int, timeout: float) -> bool:
        if await self.try_take(key, n):
            return True
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.queues.setdefault(key, deque()).append(fut)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            if fut.done() and not fut.cancelled():
                return True  # granted as the wait ended
            fut.cancel()
            return False

    async def give(self, key: str, n: int) -> None:
        queue = self.queues.get(key)
        while queue:
            fut = queue.popleft()
            if not fut.done():
                fut.set_result(True)
                return
        self.free[key] = self.free.get(key, n) + 1

    async def reserve(self, key: str, interval: float, k: float) -> float:
        start = max(self.tat.get(key, 0.0), time.time())
        self.tat[key] = start + k * interval
        return start

    async def get(self, key: str) -> tuple[int, Any]:
        return self.values.get(key, (0, None))

    async def put(self, key: str, version: int, value: Any) -> bool:
        """Set ``value`` if the value is still at ``version`` (compare-and-set)."""
        if self.values.get(key, (0, None))[0] != version:
            return False
        self.values[key] = (version + 1, value)
        return True

    async def remove(self, key: str) -> None:
        self.values.pop(key, None)


class _Semaphore:
    """A ``RemoteSemaphore`` of ``n`` units in the actor."""

    remote = True

    def __init__(self, actor: Any, key: str, n: int) -> None:
        self.actor, self.key, self.n = actor, f"{n}:{key}", n

    def try_take(self) -> bool:
        return bool(_ray().get(self.actor.try_take.remote(self.key, self.n)))

    def take(self, timeout: float) -> bool:
        return bool(_ray().get(self.actor.take.remote(self.key, self.n, timeout)))

    def give(self) -> None:
        self.actor.give.remote(self.key, self.n)  # in order after this process's takes


class _Rate:
    """A ``RateStore``: start times ``per/count`` seconds apart, reserved in the actor."""

    def __init__(self, actor: Any, key: str, count: float, per: float) -> None:
        self.actor, self.key, self.interval = actor, f"{count:g}/{per:g}:{key}", per / count

    def reserve(self, k: float = 1) -> float:
        return float(_ray().get(self.actor.reserve.remote(self.key, self.interval, k)))


class _Shared:
    """A ``SharedValue`` in the actor, updated by compare-and-set."""

    def __init__(self, actor: Any, key: str) -> None:
        self.actor, self.key = actor, key

    def get(self) -> Any:
        return _ray().get(self.actor.get.remote(self.key))[1]

    def update(self, change: Callable[[Any], Any]) -> Any:
        ray = _ray()
        while True:
            version, old = ray.get(self.actor.get.remote(self.key))
            value = change(copy.deepcopy(old))
            if ray.get(self.actor.put.remote(self.key, version, value)):
                return value

    def remove(self) -> None:
        _ray().get(self.actor.remove.remote(self.key))


class RayLimits(LimitsBackend):
    """Limits kept by the job's ``LimitsActor`` (a ``LimitsBackend``)."""

    name = "ray"

    def __init__(self, actor: Any, job_id: str) -> None:
        self.actor = actor
        self.directory = actor_name(job_id)  # the core's limiter cache key: one per job

    def semaphore(self, key: str, n: int) -> _Semaphore:
        return _Semaphore(self.actor, key, n)

    def rate(self, key: str, count: float, per: float) -> _Rate:
        return _Rate(self.actor, key, count, per)

    def shared(self, key: str) -> _Shared:
        return _Shared(self.actor, key)


# this process's backend: "driver" (the job's actor, once started here) or "worker" (what
# this Ray worker found, None included); a forked child looks again
_FOUND: Table[str, RayLimits | None] = Table("daft.limits")


def _ray() -> Any:
    return sys.modules["ray"]  # loaded wherever this backend is in use (Daft's Ray runner)


def start() -> RayLimits:
    """In the driver, once Ray is up: the job's actor (made if missing), installed here."""
    ray = _ray()
    job = ray.get_runtime_context().get_job_id()
    found = _FOUND.get("driver")
    if found is None or found.directory != actor_name(job):
        actor = ray.remote(num_cpus=0)(LimitsActor).options(
            name=actor_name(job), namespace=NAMESPACE, get_if_exists=True).remote()
        found = _FOUND["driver"] = RayLimits(actor, job)
    return found


def stop() -> None:
    """The driver no longer uses the Ray backend (the actor ends with the job)."""
    _FOUND.pop("driver", None)


def probe() -> RayLimits | None:
    """The backend in a driver that started Daft on Ray, or in a Ray worker of such a job;
    else ``None``."""
    driver = _FOUND.get("driver")
    if driver is not None:
        return driver
    ray = sys.modules.get("ray")
    if ray is None or not getattr(ray, "is_initialized", lambda: False)():
        return None
    if "worker" in _FOUND:
        return _FOUND["worker"]
    context = ray.get_runtime_context()
    found = None
    if context.worker.mode == ray.WORKER_MODE:
        job = context.get_job_id()
        try:
            found = RayLimits(ray.get_actor(actor_name(job), namespace=NAMESPACE), job)
        except ValueError:  # no DaftEngine(runner="ray") started this job's limits
            found = None
    _FOUND["worker"] = found
    return found


register_backend(probe)
