"""The batch UDF: one Daft batch of item rows -> ``execute_batch`` -> one payload cell.

The UDF receives the row ids and the mapped input columns of one Daft batch, cuts them
into runs of consecutive row ids (a ``Chunk`` is a contiguous item range; Daft keeps the
rows of a batch in order, so this is one run in practice, but nothing relies on it), runs
the shared plan executor on each run and returns a ``Binary`` column that holds, in the
batch's first row, a payload naming what happened (the other rows are null and are
filtered out before anything reaches the driver):

- ``native`` runner: UDFs run in threads of the driver process, so the payload is only a
  key into ``_MAILBOX`` — ``BatchResult`` objects (values, events, exceptions with their
  tracebacks) reach the driver without being serialized at all;
- ``ray`` runner: the payload is the cloudpickled result.

With ``on_error="raise"`` a failing batch returns its (annotated, original) exception as
its payload instead of raising it inside Daft, which would wrap it in a
``DaftCoreException``; the driver re-raises it unchanged.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import cloudpickle
import pyarrow as pa
from daft import Series

from hypernodes_dist.engines.kit import unpicklable
from hypernodes_dist.errors import portable
from hypernodes_dist.execution.batch import run_batch as run_batch_async
from hypernodes_dist.execution.job import BatchResult, BatchSettings, Chunk
from hypernodes_dist.execution.syncio import on_process_loop, run_sync
from hypernodes_dist.perprocess import Table
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.limits import shared

from .teardown import watch

__all__ = ["Failure", "make_udf", "receive", "close"]

# native runner only: payloads parked in the driver process, keyed by (map token, serial),
# and the maps stopped (their late batches park nothing); the lock is the mailbox's
_MAILBOX: Table[bytes, Any] = Table("daft.udf.mailbox")
_CANCELLED: Table[str, bool] = Table("daft.udf.cancelled")
_serial = itertools.count()
# how a UDF awaits one batch's coroutine: in place, or on the process loop
RunChunk = Callable[[Coroutine[Any, Any, BatchResult]], Awaitable[BatchResult]]


class Failure:
    """A batch's exception, carried back to the driver instead of raised inside Daft."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def make_udf(
    plan: Plan,
    names: tuple[str, ...],
    broadcast: dict[str, Any],
    settings: BatchSettings,
    token: str,
    local: bool,
) -> Callable[..., Any]:
    """The function a Daft batch UDF wraps (plan, broadcast and settings in its closure):
    rows in, a column of pickled cells out (a coroutine of it for the flowing, async UDF)."""

    def start(rows: Series, columns: tuple[Series, ...]) -> list[Chunk] | None:
        if not local:
            watch()  # this Ray worker tears its resources down when the engine closes
        if _stopped(token, local):
            return None
        ids = rows.to_pylist()
        values = [c.to_pylist() for c in columns]
        return [Chunk(ids[a], b - a, {k: v[a:b] for k, v in zip(names, values)}, broadcast)
                for a, b in consecutive_runs(ids)]

    async def outcome(chunks: list[Chunk], run: RunChunk) -> list[BatchResult] | Failure:
        try:
            return [await run(run_batch_async(plan, chunk, settings)) for chunk in chunks]
        except Exception as exc:  # on_error="raise": the first failure, annotated by the core
            return Failure(exc if local else portable(exc))

    def cells(n: int, found: list[BatchResult] | Failure | None) -> pa.Array:
        if found is None:  # the map has stopped: no payload
            return pa.nulls(n, pa.large_binary())
        out: list[bytes | None] = [None] * n
        out[0] = _send(found, token, local)
        return pa.array(out, pa.large_binary())

    def run_batch(rows: Series, *columns: Series) -> pa.Array:
        chunks = start(rows, columns)  # (a Ray round trip: not on the process loop)
        return cells(len(rows), None if chunks is None else run_sync(
            outcome(chunks, _awaited), needs_loop=plan.is_async or plan.flows))

    async def flow_batch(rows: Series, *columns: Series) -> pa.Array:
        """Plans whose items flow, on the native runner: batches are coroutines of Daft's
        loop, several at once, so one ending with its slowest item holds back none; their
        calls run on the process loop (where every async call of a process runs)."""
        chunks = start(rows, columns)
        return cells(len(rows), None if chunks is None else await outcome(chunks, on_process_loop))

    return flow_batch if local and plan.flows else run_batch


async def _awaited(batch: Coroutine[Any, Any, BatchResult]) -> BatchResult:
    """A batch awaited where the UDF runs (``run_sync``: on the process loop when the plan
    is async, else driven without a loop, as ``execute_batch`` does)."""
    return await batch


def consecutive_runs(ids: list[int]) -> list[tuple[int, int]]:
    """``[a, b)`` positions of maximal runs of consecutive row ids."""
    if ids and ids[-1] - ids[0] == len(ids) - 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return [(0, len(ids))]
    runs, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            runs.append((start, i))
            start = i
    return runs


def _send(outcome: Any, token: str, local: bool) -> bytes:
    if not local:
        return b"P" + cloudpickle.dumps(outcome)
    key = f"{token}:{next(_serial)}".encode()
    with _MAILBOX.lock:
        if token in _CANCELLED:  # the driver has stopped reading: park nothing
            return b"X"
        _MAILBOX[key] = outcome
    return b"L" + key


def receive(payload: bytes) -> list[BatchResult] | Failure:
    """The driver side of ``_send``."""
    if payload[:1] == b"P":
        return cloudpickle.loads(payload[1:])
    with _MAILBOX.lock:
        return _MAILBOX.pop(payload[1:])


def _stopped(token: str, local: bool) -> bool:
    """Whether the driver stopped the map: a batch that starts after a failure or a budget
    stop runs nothing (on Ray the mark is in the job's limits actor, one round trip a
    batch). Module-level: the UDF's closure must not hold this process's tables."""
    return token in _CANCELLED if local else bool(shared(f"map-stopped-{token}").get())


def close(token: str, stopped: bool, local: bool = True) -> None:
    """End one map: parked results go; if it ``stopped`` early, later batches skip work
    (on Ray: told through the job's limits actor)."""
    if stopped and not local:
        shared(f"map-stopped-{token}").update(lambda _: True)
    prefix = f"{token}:".encode()
    with _MAILBOX.lock:
        if stopped:  # one short string per failed map, so late batches park nothing
            _CANCELLED[token] = True
        for key in [k for k in _MAILBOX if k.startswith(prefix)]:
            del _MAILBOX[key]


def apply_udf(udf: Any, args: list[Any], plan: Plan, broadcast: dict[str, Any]) -> Any:
    """``udf(*args)``; Daft's serializability check failing names the node or input that
    does not pickle (``UnpicklableError``, as on every engine)."""
    try:
        return udf(*args)
    except ValueError as exc:
        culprit = unpicklable(plan, broadcast, "Daft's workers")
        if culprit is None:
            raise
        raise culprit from exc
