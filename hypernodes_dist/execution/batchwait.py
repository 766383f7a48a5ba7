"""A worker's side of a map's provider Batch API: where it records requests and reads answers.

``BatchLink`` (in ``BatchSettings.batch``, picklable: the map's batch folder) reaches every
process that runs the map's items; ``execute_batch`` makes it current (``LINK``) for the
batch's calls. In a ``batch_api=True`` node (``resources/bind.py``) each client a
``BatchTransport`` supports is swapped for its recording copy (``batchapi.recording``),
made once per process, client and folder: its calls append to the folder's ``RequestLog``
and read the ``AnswerStore``. ``outcome(exc, node)`` turns the signals a call raised into
what the executor keeps: ``WaitingForBatch`` (the item waits), or the item's error.
``batch_gates(gates)`` are a ``batch_api`` node's gates: its network gates taken only by an
attempt that may reach the network.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

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
from hypernodes_dist.policies.gates import BudgetGate, Entry, Gate

__all__ = ["BatchLink", "LINK", "swap_clients", "outcome", "batch_gates"]


@dataclass(frozen=True)
class BatchLink:
    """The map's batch folder, as every worker reaches it; ``run``: this run of the map
    (each run reads the folder anew in every process: a folder deleted between two runs
    serves no answer it no longer holds)."""

    folder: str
    run: str = ""

    def stores(self) -> tuple[RequestLog, AnswerStore]:
        """This process's request log and answer store of the folder for this run (made
        once; a process keeps those of its last few runs: a notebook running map after map
        holds no answer index of the earlier ones)."""
        return _STORES.get((self.folder, self.run), lambda: (RequestLog(self.folder),
                                                             AnswerStore(self.folder)))


LINK: ContextVar[BatchLink | None] = ContextVar("hn_batch_link", default=None)
_STORES: Memo[tuple[RequestLog, AnswerStore]] = Memo("execution.batchwait.stores", keep=4)
# the recording copies hold their run's stores: as few kept
_COPIES: Memo[tuple[Any, Any]] = Memo("execution.batchwait.copies", keep=32)


def supported(client: Any) -> bool:
    """Whether a Batch API transport carries ``client``'s calls (asked once per type: a
    transport recognizes a client by its class)."""
    return _SUPPORTED.get((type(client),), lambda: any(t.supports(client) for t in SUPPORTED))


_SUPPORTED: Memo[bool] = Memo("execution.batchwait.supported")


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
            out[p] = _COPIES.get((link, p, id(client)),
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


def batch_gates(gates: tuple[Gate, ...]) -> tuple[Gate, ...]:
    """A ``batch_api`` node's gates: each network gate (hold-off, concurrency, rate,
    quantities, learned limits) taken only by an attempt that may reach the network; the
    budget's as they are (it counts what the calls metered)."""
    # a _WhenOnline carries its gate's holds/meters per instance (Gate declares them per class)
    return tuple(g if isinstance(g, BudgetGate) else cast(Gate, _WhenOnline(g)) for g in gates)


class _WhenOnline:
    """A network gate of a ``batch_api`` node, entered only while the map's answers hold a
    request to send online (``online_after``): until then each of the node's calls is
    recorded or answered from a batch, none reaches the network, so none takes a turn (a
    concurrency unit, a rate turn, a hold-off's wait). No map (``run()``): always."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.holds, self.meters = gate.holds, gate.meters

    async def enter(self, entry: Entry) -> float:
        if not _may_go_online(entry):
            return 0.0
        entry.keep(self, True)
        return await self.gate.enter(entry)

    def exit(self, entry: Entry, error: BaseException | None) -> None:
        if entry.kept_by(self):
            self.gate.exit(entry, error)


_ONLINE = object()  # an attempt's ``Entry.keep`` key: whether it may reach the network


def _may_go_online(entry: Entry) -> bool:
    """Whether this attempt may reach the network (asked once per attempt)."""
    known = entry.kept_by(_ONLINE)
    if known is None:
        link = LINK.get()
        known = link is None or link.stores()[1].sends_online()
        entry.keep(_ONLINE, known)
    return bool(known)
