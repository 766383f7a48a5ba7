"""What crosses the process boundary on the way back: a partition's result as bytes.

A worker process pickles its ``BatchResult`` itself (``pack``) instead of leaving it to
Dask, so a value that cannot be pickled — a node that returns a lock, a client, an open
file — is found here, where the executor still knows its node and item: with
``on_error="collect"`` that item fails with ``UnpicklableError`` (the other items arrive
intact), with ``"raise"`` the map raises it. Left to Dask, the whole map would fail with a
bare ``TypeError`` from Dask's internals. The driver calls ``unpack`` on what arrives.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import Any

import cloudpickle

from hypernodes_dist.errors import UnpicklableError, annotate
from hypernodes_dist.execution.job import BatchResult, BatchSettings
from hypernodes_dist.missing import MISSING
from hypernodes_dist.plan import Plan

__all__ = ["Packed", "pack", "unpack"]


class Packed:
    """A pickled ``BatchResult``: schedulers move its bytes without looking inside."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __getstate__(self) -> bytes:
        return self.data

    def __setstate__(self, data: bytes) -> None:
        self.data = data


def unpack(result: Any) -> Any:
    """The ``BatchResult`` a worker sent (results of in-process schedulers pass as they are)."""
    return pickle.loads(result.data) if isinstance(result, Packed) else result


def pack(result: BatchResult, plan: Plan, settings: BatchSettings) -> Packed:
    """``result`` pickled; items holding an unpicklable output fail (see the module doc)."""
    data = _dumps(result)
    if data is None:
        _drop_unpicklable(result, plan, settings)
        data = _dumps(result)
        if data is None:
            _scrub_events(result.events)
            data = cloudpickle.dumps(result, protocol=5)
    return Packed(data)


def _dumps(obj: Any) -> bytes | None:
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:
        try:
            return cloudpickle.dumps(obj, protocol=5)
        except Exception:
            return None


def _problem(value: Any) -> Exception | None:
    if value is MISSING:
        return None
    try:
        cloudpickle.dumps(value, protocol=5)
        return None
    except Exception as exc:
        return exc


def _drop_unpicklable(result: BatchResult, plan: Plan, settings: BatchSettings) -> None:
    """Fail each item with an output that does not pickle; its outputs and history go."""
    for name, column in result.outputs.items():
        for i, value in enumerate(column):
            exc = _problem(value)
            if exc is None or i in result.errors:
                continue
            producer = plan.producers.get(name, (name,))[0]
            item = result.offset + i
            error = UnpicklableError(
                f"node {producer!r} returned a value for {name!r} (item {item}) that cannot be "
                f"sent back from the worker process: it does not pickle "
                f"({type(exc).__name__}: {exc}); return plain data (create the object where it "
                'is used), or run this map with DaskEngine(scheduler="threads")')
            annotate(error, producer, item)
            if settings.on_error == "raise":
                raise error
            result.errors[i] = error
            result.drop_outputs(i)


def _scrub_events(events: Iterable[Any]) -> None:
    """Replace output values in events that do not pickle by ``MISSING`` (last resort)."""
    for event in events:
        for part in getattr(event, "parts", None) or ():
            outputs = getattr(part, "outputs", None)
            if isinstance(outputs, dict):
                part.outputs = {k: [MISSING if _problem(v) else v for v in col]
                                for k, col in outputs.items()}
        outputs = getattr(event, "outputs", None)
        if isinstance(outputs, dict):
            event.outputs = {k: MISSING if _problem(v) else v for k, v in outputs.items()}
