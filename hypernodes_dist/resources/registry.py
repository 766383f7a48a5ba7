"""The per-process registry: each resource built once per process (and event loop), handed
to every call, torn down when the engine closes or the process ends.

An entry is keyed by the resource's code identity, the digest of the inputs it was built
with, and, for async resources, the event loop it was built on (the process loop, see
``execution.syncio``). Builds are serialized per key: concurrent first calls (threads of a
Dask worker, coroutines of one loop) wait for the one build. A failed build is remembered
for ``FAILED_SECONDS``: the calls meanwhile fail at once with the same ``ResourceError``
instead of building again per item. A forked child starts with an empty registry.

At close, after the teardowns, a value left open that has an ``aclose()``/``close()``
coroutine (an ``openai``/``httpx`` async client the resource built) is closed on the
process loop, then every value is let go and collected there. Left to the garbage
collector, such a client's sockets are freed by their transports' finalizers and then its
own finalizer schedules ``aclose()``, which unregisters those socket numbers from the loop:
by then they belong to new connections, whose answers the loop never sees (issue 34's map
that never returned).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import multiprocessing.util
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypernodes_dist.errors import ResourceError
from hypernodes_dist.execution.context import worker_id
from hypernodes_dist.execution.syncio import (
    call_on_loop,
    in_process_loop,
    process_loop,
    started_loop,
)
from hypernodes_dist.perprocess import PROCESS
from hypernodes_dist.resources.declare import Resource

__all__ = ["Registry", "REGISTRY", "release_resources", "FAILED_SECONDS"]

FAILED_SECONDS = 5.0  # a failed build is not retried in this process for this long
TEARDOWN_SECONDS = 30.0  # the longest an async teardown may take at close
RELEASE_SECONDS = 5.0  # the longest close waits for the loop to collect torn-down values


@dataclass
class Entry:
    """One built resource: its value, its teardown (the generator), where it was built."""

    value: Any
    teardown: Any = None  # the (async) generator to resume for the teardown
    loop: asyncio.AbstractEventLoop | None = None


@dataclass
class Failure:
    error: ResourceError
    at: float = field(default_factory=time.monotonic)


Key = tuple[str, str, int]


class Registry:
    """This process's built resources (``REGISTRY``)."""

    def __init__(self) -> None:
        self.entries: dict[Key, Entry] = {}
        self.failures: dict[Key, Failure] = {}
        self.order: list[Key] = []  # build order: torn down in reverse
        self.lock = threading.Lock()
        self.building: dict[Key, threading.Lock] = {}  # sync builds, one at a time per key
        self.awaiting: dict[Key, asyncio.Lock] = {}  # async builds, one at a time per key
        self.finalizer: Any = None
        self.generation = 0  # counts closes: a caller's remembered values are then stale

    # -- getting a resource ------------------------------------------------------------------
    def get(self, res: Resource, ident: str, digest: str, inputs: Mapping[str, Any]) -> Any:
        """The built resource for a sync caller (building it here if needed)."""
        key = (ident, digest, self._loop_key(res))
        entry = self.entries.get(key)
        if entry is not None:
            return entry.value
        with self._build_lock(key):
            entry = self.entries.get(key)
            if entry is None:
                self._raise_recent_failure(key)
                if res.is_async:
                    if in_process_loop():
                        raise ResourceError(
                            f"resource {res.name!r} is async but a sync node running on the "
                            f"event loop asked for it (worker {worker_id()}); make the node "
                            "async, or the resource a plain function", res.name, worker_id())
                    return call_on_loop(self.aget(res, ident, digest, inputs))
                entry = self._built(key, res, lambda: _build_sync(res, inputs))
            return entry.value

    async def aget(self, res: Resource, ident: str, digest: str,
                   inputs: Mapping[str, Any]) -> Any:
        """The built resource for an async caller (async resources build on its loop)."""
        key = (ident, digest, self._loop_key(res))
        entry = self.entries.get(key)
        if entry is not None:
            return entry.value
        if not res.is_async:
            return self.get(res, ident, digest, inputs)
        lock = self._async_lock(key)
        async with lock:
            entry = self.entries.get(key)
            if entry is None:
                self._raise_recent_failure(key)
                try:
                    built = await _build_async(res, inputs)
                except Exception as exc:
                    raise self._failed(key, res, exc) from exc
                entry = self._keep(key, built)
            return entry.value

    # -- building ------------------------------------------------------------------------------
    def _loop_key(self, res: Resource) -> int:
        if not res.is_async:
            return 0
        try:
            return id(asyncio.get_running_loop())
        except RuntimeError:
            return id(process_loop())

    def _build_lock(self, key: Key) -> threading.Lock:
        with self.lock:
            return self.building.setdefault(key, threading.Lock())

    def _async_lock(self, key: Key) -> asyncio.Lock:
        with self.lock:
            return self.awaiting.setdefault(key, asyncio.Lock())

    def _built(self, key: Key, res: Resource, build: Any) -> Entry:
        try:
            built = build()
        except Exception as exc:
            raise self._failed(key, res, exc) from exc
        return self._keep(key, built)

    def _keep(self, key: Key, built: Entry) -> Entry:
        with self.lock:
            self.entries[key] = built
            self.order.append(key)
            self.failures.pop(key, None)
            if self.finalizer is None:  # torn down at process end (worker processes too)
                self.finalizer = multiprocessing.util.Finalize(None, self.close, exitpriority=50)
        return built

    def _failed(self, key: Key, res: Resource, exc: Exception) -> ResourceError:
        worker = worker_id()
        error = ResourceError(
            f"building resource {res.name!r} failed on worker {worker}: "
            f"{type(exc).__name__}: {exc}", res.name, worker)
        error.__cause__ = exc
        self.failures[key] = Failure(error)
        return error

    def _raise_recent_failure(self, key: Key) -> None:
        failed = self.failures.get(key)
        if failed is not None and time.monotonic() - failed.at < FAILED_SECONDS:
            raise failed.error

    # -- teardown ----------------------------------------------------------------------------
    def close(self) -> None:
        """Tear every resource down, newest first; a failing teardown is skipped."""
        with self.lock:
            self.generation += 1
            keys, self.order = self.order[::-1], []
            entries = [self.entries.pop(k) for k in keys if k in self.entries]
            self.failures.clear()
            self.building.clear()
            self.awaiting.clear()
        for entry in entries:
            _teardown(entry)
        if entries:
            del entry
            _release(entries)


def _release(entries: list[Entry]) -> None:
    """Close the torn-down values left open on the process loop, then let go of them and
    collect there (see the module doc)."""
    if started_loop() is None:  # nothing can be bound to a process loop
        return

    async def close_all() -> None:  # returns: no reference of ours left for the collection
        for entry in entries:
            await _close_left_open(entry)

    async def on_loop() -> None:
        await close_all()
        entries.clear()
        gc.collect()

    if in_process_loop():  # cannot wait for the loop from its own thread
        return
    try:
        call_on_loop(on_loop(), RELEASE_SECONDS)
    except Exception:  # noqa: S110 - a slow close never breaks a close
        pass


async def _close_left_open(entry: Entry) -> None:
    """Await the ``aclose()``/``close()`` coroutine of a value its teardown left open."""
    value = entry.value
    close = getattr(value, "aclose", None) or getattr(value, "close", None)
    if not inspect.iscoroutinefunction(close) or getattr(value, "is_closed", False) is True:
        return
    try:
        await close()
    except Exception:  # noqa: S110 - a failing close never breaks a close
        pass


def _build_sync(res: Resource, inputs: Mapping[str, Any]) -> Entry:
    made = res.func(**inputs)
    if inspect.isgenerator(made):
        return Entry(next(made), made)
    return Entry(made)


async def _build_async(res: Resource, inputs: Mapping[str, Any]) -> Entry:
    made = res.func(**inputs)
    loop = asyncio.get_running_loop()
    if inspect.isasyncgen(made):
        return Entry(await made.__anext__(), made, loop)
    if inspect.isawaitable(made):
        made = await made
    return Entry(made, None, loop)


def _teardown(entry: Entry) -> None:
    gen = entry.teardown
    if gen is None:
        return
    try:
        if inspect.isgenerator(gen):
            _finish(gen)
        elif entry.loop is not None and not entry.loop.is_closed():
            _finish_async(gen, entry.loop)
    except Exception:  # noqa: S110 - a teardown never breaks a close
        pass


def _finish(gen: Any) -> None:
    try:
        next(gen)
    except StopIteration:
        return
    gen.close()


def _finish_async(gen: Any, loop: asyncio.AbstractEventLoop) -> None:
    async def finish() -> None:
        try:
            await gen.__anext__()
        except StopAsyncIteration:
            return
        await gen.aclose()

    if loop is process_loop() and not in_process_loop():
        call_on_loop(finish(), TEARDOWN_SECONDS)
    elif loop.is_running():  # another loop (a user's): schedule it there
        asyncio.run_coroutine_threadsafe(finish(), loop)
    else:
        loop.run_until_complete(finish())


REGISTRY = Registry()


def release_resources() -> None:
    """Tear down every resource this process built (engines call it on ``close()``)."""
    REGISTRY.close()


def _forget_after_fork() -> None:
    """A forked child neither uses nor tears down what its parent built."""
    global REGISTRY
    REGISTRY.entries.clear()
    REGISTRY.order.clear()
    REGISTRY = Registry()


PROCESS.register("resources", _forget_after_fork)  # forgotten in a forked child
