"""A worker's side of a map's provider Batch API: where it records requests and reads answers.

``BatchLink`` (in ``BatchSettings.batch``, picklable: the map's batch folder) reaches every
process that runs the map's items; ``execute_batch`` makes it current (``LINK``) for the
batch's calls. In a ``batch_api=True`` node (``resources/bind.py``) each client a
``BatchTransport`` supports is swapped for its recording copy (``batchapi.recording``),
made once per process, client and folder: its calls append to the folder's ``RequestLog``
and read the ``AnswerStore``. ``outcome(exc, node)`` turns the signals a call raised into
what the executor keeps: ``WaitingForBatch`` (the item waits), or the item's error.
``GatesByReach(gates)`` gives a ``batch_api`` node's gates per attempt: its network gates
are taken only by an attempt that may reach the network.
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
from hypernodes_dist.perprocess import Memo, Table
from hypernodes_dist.policies.gates import BudgetGate, Gate

__all__ = ["BatchLink", "LINK", "swap_clients", "outcome", "GatesByReach"]


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
    for p in names:
        client = out[p]
        last = _LAST.get(p)  # the copy this process used last for p: the same call again
        if last is not None and last[0] is link and last[1] is client:
            out[p] = last[2]
        elif supported(client):
            log, answers = link.stores()
            out[p] = _COPIES.get((link, p, id(client)),
                                 functools.partial(_copy, client, answers, log, p))[1]
            _LAST[p] = (link, client, out[p])
    return out


# resource name -> (link, client, its recording copy) last swapped in: the next call finds
# its copy by identity, not through the memo (a forked child starts empty)
_LAST: Table[str, tuple[Any, Any, Any]] = Table("execution.batchwait.last")


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


class GatesByReach:
    """A ``batch_api`` node's gates for each attempt: all of them while the map's answers
    hold a request to send online (``online_after``); until then each call is recorded or
    answered from a batch and none reaches the network, so an attempt takes its budget's
    gates only (the budget counts what the calls metered), no network turn (a concurrency
    unit, a rate turn, a hold-off's wait). No map (``run()``): all of them. The batch's
    answer store is found once per link."""

    __slots__ = ("gates", "offline", "link", "answers")

    def __init__(self, gates: tuple[Gate, ...]) -> None:
        self.gates = gates
        self.offline = tuple(g for g in gates if isinstance(g, BudgetGate))
        self.link: BatchLink | None = None
        self.answers: AnswerStore | None = None

    def __call__(self) -> tuple[Gate, ...]:
        link = LINK.get()
        if link is None:
            return self.gates
        answers = self.answers
        if answers is None or link is not self.link:
            self.link, answers = link, link.stores()[1]
            self.answers = answers
        return self.gates if answers.sends_online() else self.offline
