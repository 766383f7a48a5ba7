"""A worker's side of a map's provider Batch API: where it records requests and reads answers.

``BatchLink`` (in ``BatchSettings.batch``, picklable: the map's batch folder) reaches every
process that runs the map's items; ``execute_batch`` makes it current (``LINK``) for the
batch's calls. In a ``batch_api=True`` node (``resources/bind.py``) each client a
``BatchTransport`` supports is swapped for its recording copy (``batchapi.recording``),
made once per process, client and folder: its calls append to the folder's ``RequestLog``
and read the ``AnswerStore``. ``outcome(exc, node)`` turns the signals a call raised into
what the executor keeps: ``WaitingForBatch`` (the item waits), or the item's error.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from hypernodes_dist.batchapi import SUPPORTED
from hypernodes_dist.batchapi.recording import (
    BatchWait,
    BudgetRefusal,
    UnbatchableCall,
    recording_client,
)
from hypernodes_dist.batchapi.store import AnswerStore, RequestLog
from hypernodes_dist.errors import WaitingForBatch
from hypernodes_dist.perprocess import Memo

__all__ = ["BatchLink", "LINK", "swap_clients", "outcome"]


@dataclass(frozen=True)
class BatchLink:
    """The map's batch folder, as every worker reaches it."""

    folder: str

    def stores(self) -> tuple[RequestLog, AnswerStore]:
        """This process's request log and answer store of the folder (made once)."""
        return _STORES.get(self.folder, lambda: (RequestLog(self.folder),
                                                 AnswerStore(self.folder)))


LINK: ContextVar[BatchLink | None] = ContextVar("hn_batch_link", default=None)
_STORES: Memo[tuple[RequestLog, AnswerStore]] = Memo("execution.batchwait.stores")
_COPIES: Memo[tuple[Any, Any]] = Memo("execution.batchwait.copies")


def supported(client: Any) -> bool:
    """Whether a Batch API transport carries ``client``'s calls (asked once per type: a
    transport recognizes a client by its class)."""
    kind = type(client)
    known = _SUPPORTED.get(kind)
    if known is None:
        known = _SUPPORTED[kind] = any(t.supports(client) for t in SUPPORTED)
    return known


_SUPPORTED: dict[type, bool] = {}


def swap_clients(built: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """``names``' values of ``built`` with each supported client replaced by its recording
    copy (no link: the map runs no batches, e.g. ``run()``: unchanged)."""
    link = LINK.get()
    out = {p: built[p] for p in names}
    if link is None:
        return out
    log, answers = link.stores()
    for p in names:
        client = out[p]
        if supported(client):
            out[p] = _COPIES.get((link.folder, p, id(client)),
                                 functools.partial(_copy, client, answers, log, p))[1]
    return out


def _copy(client: Any, answers: AnswerStore, log: RequestLog, source: str) -> tuple[Any, Any]:
    """The recording copy of ``client``, beside the original (whose id is then not reused
    while both live)."""
    return client, recording_client(client, answers, log.recorder(source))


def outcome(exc: BaseException, node: str) -> BaseException:
    """What a batch signal raised in ``node``'s code becomes: ``WaitingForBatch`` (the item
    waits), the error of an unbatchable call or of a budget refusal; others unchanged."""
    if isinstance(exc, BatchWait):
        return WaitingForBatch(node, exc.digest)
    if isinstance(exc, UnbatchableCall):
        return exc.error(f"node {node!r}")
    if isinstance(exc, BudgetRefusal):
        return exc.error()
    return exc
