"""One way to send work to Dask's processes and run it there: the map path (``compile.py``,
``engine.py``) and the dataset path (``datasets.py``) both use it.

What every task of one call shares (a map's ``Payload``, a dataset map's ``PartTask``) is
pickled once in the driver (``pickled``) and travels as a ``Shipment``; what differs
between the paths comes in as arguments, the way ``dask.local.get_async`` takes its
``dumps``/``loads``/``pack_exception``, never as subclasses:

- in the driver, ``pickled(obj, where, culprit)`` makes the ``Shipment`` (``culprit()``
  names the node or input that does not pickle); ``on_processes`` writes it to the process
  pool's scratch folder for the tasks to reference (removed when the call ends; on threads
  the object itself is shared, no copy), ``on_cluster`` scatters it to every worker
  (released when the call ends). ``InFlight`` feeds results back as futures finish and
  cancels the rest on an error or an interrupt;
- in the task, ``run_there(shared, work, pack)``: the shared object (unpickled once per
  process and call), ``work(it)``, and in another process ``pack(result, it)`` (how the
  result crosses back) inside ``errors.call_portably`` (an exception that crosses back);
- a worker process that dies raises nothing: ``local.compute_local(..., died=)`` turns
  the pool's ``BrokenProcessPool`` into the caller's error, naming the keys it ran.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import cloudpickle

from hypernodes_dist.errors import UnpicklableError, call_portably
from hypernodes_dist.execution.context import worker_id
from hypernodes_dist.perprocess import Table

from .cluster import ProcessPool

__all__ = ["InFlight", "Shipment", "missing_module", "on_cluster", "on_processes", "pickled",
           "run_there", "write_shipment"]

T = TypeVar("T")
R = TypeVar("R")

_LOADED: Table[str, Any] = Table("dask.shipping.loaded")  # digest -> object, newest last
_KEEP = 4  # shared objects of recent calls kept unpickled per worker process


@dataclass
class Shipment:
    """A pickled shared object: inline bytes (``data``) or a file on this machine (``path``)."""

    digest: str
    data: bytes | None = None
    path: str | None = None

    def load(self) -> Any:
        """The object, unpickled once per process and call (the call's tasks share it)."""
        with _LOADED.lock:
            found = _LOADED.pop(self.digest, None)
            if found is not None:
                _LOADED[self.digest] = found  # the newest again
                return found
            try:
                if self.data is not None:
                    obj = cloudpickle.loads(self.data)
                else:
                    assert self.path is not None
                    with open(self.path, "rb") as f:
                        obj = cloudpickle.load(f)
            except ModuleNotFoundError as exc:
                raise missing_module(exc) from exc
            _LOADED[self.digest] = obj
            while len(_LOADED) > _KEEP:
                del _LOADED[next(iter(_LOADED))]
            return obj


def missing_module(exc: ModuleNotFoundError) -> ModuleNotFoundError:
    """``exc`` (raised in a worker) saying what to do about a module only the driver has."""
    name = exc.name or "?"
    return ModuleNotFoundError(
        f"{exc} in Dask worker {worker_id()}: the graph's nodes or inputs come from module "
        f"{name!r}, which this worker cannot import. Install it on every worker (pip install "
        f"your package there), send a single file with client.upload_file('{name}.py'), or "
        "define the nodes in a package the workers can import", name=exc.name)


# ------------------------------------------------------------------ in the driver


def pickled(obj: Any, where: str, culprit: Callable[[], UnpicklableError | None]) -> Shipment:
    """``obj`` pickled once for ``where`` (e.g. "Dask workers"), or ``UnpicklableError``:
    ``culprit()``'s (the node or input at fault), else one naming the pickling error."""
    try:
        data = cloudpickle.dumps(obj)
    except Exception as exc:
        raise culprit() or UnpicklableError(
            f"the map cannot be sent to {where}: {exc}") from exc
    return Shipment(hashlib.blake2b(data, digest_size=16).hexdigest(), data=data)


def write_shipment(data: bytes, digest: str, directory: str) -> Shipment:
    """Write the bytes once to ``directory``; tasks carry only the path."""
    path = os.path.join(directory, f"payload-{digest}-{uuid.uuid4().hex[:8]}.pkl")
    with open(path, "wb") as f:
        f.write(data)
    return Shipment(digest, path=path)


@contextlib.contextmanager
def on_processes(pool: ProcessPool | None, obj: Any,
                 ship: Callable[[], Shipment]) -> Iterator[Any]:
    """What the tasks of one call on a local scheduler share: ``obj`` itself (threads,
    sync: ``pool`` is None), or ``ship()`` (``obj`` pickled, e.g. by ``pickled``) written
    to a file in ``pool``'s scratch folder, removed when the call ends."""
    if pool is None:
        yield obj
        return
    shipment = ship()
    assert shipment.data is not None
    filed = write_shipment(shipment.data, shipment.digest, pool.scratch())
    try:
        yield filed
    finally:
        with contextlib.suppress(OSError):
            os.unlink(filed.path)  # type: ignore[arg-type]  # a filed shipment has a path


@contextlib.contextmanager
def on_cluster(client: Any, shipment: Shipment) -> Iterator[Any]:
    """``shipment`` scattered to every worker of ``client``'s cluster (losing a worker does
    not lose it): the future the tasks reference, released when the call ends."""
    [future] = client.scatter([shipment], broadcast=True, hash=False)
    try:
        yield future
    finally:
        client.cancel([future])


class InFlight:
    """Futures of one call on a cluster: ``for tag, result in in_flight`` yields each one's
    tag (what the caller submitted it for) and result as it finishes, releasing it on the
    cluster as soon as the driver holds it; futures may be added while iterating. Leaving
    the ``with`` block early (an error, an interrupt) cancels the tasks not started and
    waits for those a worker runs: their calls in flight end and are kept (cache writes,
    rows written) before the caller raises, as the core does in its own process
    (``execution/running.py``), so an immediate rerun does not pay for them again."""

    def __init__(self, client: Any) -> None:
        from distributed import as_completed

        self.client = client
        self.tags: dict[Any, Any] = {}  # every key submitted -> its tag
        self._pending: dict[Any, Any] = {}
        self._done = as_completed(loop=client.loop, with_results=True)

    def add(self, future: Any, tag: Any = None) -> None:
        self.tags[future.key] = tag
        self._pending[future.key] = future
        self._done.add(future)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for future, result in self._done:
            key = future.key
            del self._pending[key], future
            yield self.tags[key], result

    def __enter__(self) -> InFlight:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pending:
            running = self._running()
            self.client.cancel([f for k, f in self._pending.items() if k not in running])
            for key in running:  # each ends (a result or an error), also on a lost worker
                with contextlib.suppress(Exception):
                    self._pending[key].exception()
        self._pending.clear()

    def _running(self) -> set[Any]:
        """Keys of the pending futures a worker is running (or holds to run next); none
        when the scheduler cannot say (the original error goes on, nothing waited for)."""
        try:
            on_workers = {k for keys in self.client.processing().values() for k in keys}
        except Exception:  # the scheduler is gone: its workers' tasks are lost with it
            return set()
        return {k for k in self._pending if k in on_workers or str(k) in on_workers}


# ------------------------------------------------------------------ in the task


def run_there(shared: T | Shipment, work: Callable[[T], R],
              pack: Callable[[R, T], Any] | None = None) -> R | Any:
    """A task's body: ``work`` on the call's shared object. Sent as a ``Shipment`` (another
    process), the object is loaded once per process, the result goes through ``pack`` and
    an exception is made portable (``errors.call_portably``)."""
    if not isinstance(shared, Shipment):
        return work(shared)
    obj = shared.load()
    if pack is None:
        return call_portably(lambda: work(obj))
    return call_portably(lambda: pack(work(obj), obj))
