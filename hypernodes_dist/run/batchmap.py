"""A map with ``batch_api=True`` nodes, in the driver: its ``BatchLoop`` and its rounds.

``open_loop`` runs before anything else: the batch folder (``into/_hn_batches/`` or the
cache's folder; ``ValueError`` with neither), one ``BatchTransport`` per client the batch
nodes receive (built here, in the driver, from the map's broadcast inputs;
``UnsupportedClientError`` naming the supported clients), and ``settings.batch``, the link
every worker records requests and reads answers through. ``Rounds`` is ``run_rows`` of an
in-memory map: the whole map first, then only its waiting items, as a job of their own
whose positions map back to the items (``BatchSettings.items``).
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hypernodes_dist.batchapi.store import Request
from hypernodes_dist.cache.hashing import hash_value
from hypernodes_dist.errors import BudgetExceededError
from hypernodes_dist.execution.batchwait import BatchLink
from hypernodes_dist.execution.job import BatchResult, BatchSettings, MapJob
from hypernodes_dist.nodes import HyperNode
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.budget import Budget, Spent, Where
from hypernodes_dist.resources.bind import node_clients
from hypernodes_dist.run.batchloop import Backoff, BatchLoop, batch_folder, transports_for

if TYPE_CHECKING:
    from hypernodes_dist.engines.base import Engine

__all__ = ["batch_nodes", "open_loop", "map_identity", "Rounds", "POLL_ENV", "KEEP_FILES_ENV",
           "BudgetReserve"]

POLL_ENV = "HYPERNODES_BATCH_POLL"  # seconds of the first poll (tests: small)
KEEP_FILES_ENV = "HYPERNODES_BATCH_KEEP_FILES"  # "1": leave the provider's files after download


def batch_nodes(plan: Plan) -> list[HyperNode]:
    return [n for n in plan.nodes if n.batch_api]


def map_identity(plan: Plan, *parts: Any) -> str:
    """A map's id: its graph and what it runs over (the same map again, the same id; values
    with no content hash: the graph alone, its maps then share one folder)."""
    try:
        return f"{plan.graph_hash}-{hash_value(list(parts))}"
    except Exception:  # noqa: BLE001 - an unhashable input: no per-input identity
        return plan.graph_hash


def backoff() -> Backoff:
    """The loop's poll back-off (``HYPERNODES_BATCH_POLL``: the first wait, seconds)."""
    first = float(os.environ.get(POLL_ENV, Backoff.first))
    return Backoff(first=first, most=max(first, min(60.0, 30 * first)))


def _clients(node: HyperNode, broadcast: Mapping[str, Any],
             mapped: Sequence[str]) -> dict[str, Any]:
    """The node's clients, built in the driver; a resource reading a mapped input cannot
    be (which client would the driver submit with?)."""
    fetch = getattr(node, "fetch_resources", None)
    reads = {p for r, _ in (fetch.needed if fetch else ()) for p in r.params}
    bad = sorted(reads & set(mapped))
    if bad:
        raise ValueError(
            f"node {node.name!r} (batch_api=True): its resources read the mapped input(s) "
            f"{', '.join(map(repr, bad))}; the driver submits the batches with one client, "
            "so pass them once (a broadcast input), not per item")
    return node_clients(node, broadcast)


def open_loop(plan: Plan, settings: BatchSettings, broadcast: Mapping[str, Any],
              mapped: Sequence[str], into: Any, map_id: str,
              where: Where | None = None) -> BatchLoop | None:
    """The map's batch loop (``None``: no ``batch_api`` node); sets ``settings.batch``.
    ``where``: the driver's way to the workers' shared values (the budget's ledger)."""
    nodes = batch_nodes(plan)
    if not nodes:
        return None
    folder = batch_folder(into, getattr(settings.cache, "path", None), map_id)
    transports: dict[str, Any] = {}
    owners: dict[str, str] = {}  # resource -> the (first) batch node receiving it
    for node in nodes:
        clients = _clients(node, broadcast, mapped)
        transports.update(transports_for(clients, map_id, node.name))
        owners.update({r: node.name for r in clients if r not in owners})
    online = [n.online_after for n in nodes if n.online_after is not None]
    link = BatchLink(os.path.abspath(folder), uuid.uuid4().hex)  # workers may run elsewhere
    # the loop reads and writes this process's stores of the folder, which the workers
    # running here read too: one answer index in the driver's process, not two
    loop = BatchLoop(folder, transports,
                     attempts=1 + max((n.policy.retries if n.policy else 0) for n in nodes),
                     online_after=min(online) if online else None, backoff=backoff(),
                     keep_files=os.environ.get(KEEP_FILES_ENV, "") not in ("", "0"),
                     stores=link.stores())
    loop.ids, loop.owners = (settings.session_id, settings.run_prefix), owners  # its events
    if settings.budget is not None:
        loop.reserve(BudgetReserve(settings.budget, owners, where))
    settings.batch = link
    return loop


class BudgetReserve:
    """``map(budget=)`` at submission: a request reserves its expected usage (what the map
    metered so far per answered line) while its batch runs; one past a limit is not
    submitted and its item fails with ``BudgetExceededError``, as online. Before any
    answer the expected usage is unknown (0): the first batches are not limited."""

    def __init__(self, budget: Budget, owners: Mapping[str, str], where: Where | None) -> None:
        self.budget, self.owners, self.where = budget, owners, where
        self.spent: dict[str, float] = {}
        self.answered = self.live = 0

    def round(self, answered: int, live: int) -> None:
        """A submission starts: ``answered`` lines so far, ``live`` in running batches."""
        self.spent = self.budget.spent(self.where)
        self.answered, self.live = answered, live

    def __call__(self, request: Request) -> BudgetExceededError | None:
        for quantity, most in self.budget.limits:
            used = self.spent.get(quantity, 0.0)
            mean = used / self.answered if self.answered else 0.0
            if used >= most or used + mean * (self.live + 1) > most:
                node = self.owners.get(request.source, request.source)
                return self.budget.refusal(node, None, Spent(quantity, used, most))
        self.live += 1
        return None


class Collector(Protocol):
    """What ``Rounds`` hands batches to (``maprun.MapCollector``)."""

    waiting: set[int]

    def accept(self, batch: BatchResult) -> None: ...

    def accept_again(self, items: Sequence[int], batch: BatchResult) -> None: ...


class Rounds:
    """``run_rows`` of an in-memory map (``BatchLoop.run``): every item, then the waiting
    ones; returns how many wait."""

    def __init__(self, job: MapJob, engine: Engine, collector: Collector) -> None:
        self.job, self.engine, self.collector = job, engine, collector
        self.first = True

    def __call__(self) -> int:
        collector = self.collector
        if self.first:
            self.first = False
            self.engine.execute_map(self.job, collector.accept)
        elif collector.waiting:
            items = _compact(sorted(collector.waiting))
            self.engine.execute_map(self._of(items), lambda b: collector.accept_again(items, b))
        return len(collector.waiting)

    def _of(self, items: Sequence[int]) -> MapJob:
        """A job of ``items`` only (positions map back through ``settings.items``)."""
        job = self.job
        if isinstance(items, range):
            columns = {k: v[items.start:items.stop] for k, v in job.columns.items()}
        else:
            columns = {k: [v[i] for i in items] for k, v in job.columns.items()}
        settings = dataclasses.replace(job.settings, items=items)
        return MapJob(job.plan, columns, job.broadcast, len(items), settings)


def _compact(items: list[int]) -> Sequence[int]:
    """``items`` as a ``range`` when consecutive (small to ship to every worker)."""
    if items and items[-1] - items[0] + 1 == len(items):
        return range(items[0], items[-1] + 1)
    return items
