"""``map``: expand inputs into a ``MapJob``, hand it to the engine, assemble the ``MapResult``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hypernodes_dist.cache.base import Cache, prepare_cache
from hypernodes_dist.engines.base import Engine
from hypernodes_dist.events import BatchEvent, wants_events
from hypernodes_dist.execution.job import BatchResult, BatchSettings, MapJob
from hypernodes_dist.execution.running import stopping
from hypernodes_dist.inputs import check_on_error, check_select, expand, new_run_id, new_session_id
from hypernodes_dist.missing import MISSING
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.budget import check_budget
from hypernodes_dist.results import GraphResult, MapResult
from hypernodes_dist.run.batchmap import Rounds, batch_nodes, map_identity, open_loop
from hypernodes_dist.run.onbudget import Ask, Asker
from hypernodes_dist.run.progress import Tally
from hypernodes_dist.run.stops import Kept, is_budget

__all__ = ["run_map", "MapCollector", "reject_interrupts", "map_settings", "prepare_map_cache"]



def map_settings(plan: Plan, session_id: str | None, select: Iterable[str] | None,
                 on_error: str, cache: Cache | None, callbacks: Sequence[Any],
                 budget: Mapping[str, float] | None, on_budget: Ask | None) -> BatchSettings:
    """A map's settings (plain or dataset), checked: a new run-id prefix, the session."""
    run_prefix = new_run_id() + "-"
    return BatchSettings(
        session_id=session_id or new_session_id(), run_prefix=run_prefix,
        select=check_select(plan, select), on_error=check_on_error(on_error), cache=cache,
        want_events=wants_events(callbacks), budget=check_budget(budget, run_prefix, on_budget))


def prepare_map_cache(plan: Plan, cache: Cache | None, engine: Engine) -> None:
    """Before a map runs anything: node code hashed once, in the driver (workers get it with
    the plan), and every worker must see the store (``Cache`` protocol)."""
    if cache is not None:
        plan.code_ids()
        prepare_cache(cache, engine)


def run_map(
    plan: Plan,
    engine: Engine,
    inputs: Mapping[str, Any],
    map_over: str | Iterable[str],
    *,
    map_mode: str = "zip",
    session_id: str | None = None,
    select: Iterable[str] | None = None,
    on_error: str = "raise",
    progress: bool = False,
    cache: Cache | None = None,
    callbacks: Sequence[Any] = (),
    budget: Mapping[str, float] | None = None,
    on_budget: Ask | None = None,
    wait: bool = True,
) -> MapResult:
    """Run every item of a map on ``engine``; results in item order (``wait=False``, with
    ``batch_api`` nodes: once every request is submitted, ``pending`` items waiting)."""
    reject_interrupts(plan)
    columns, broadcast, n = expand(plan, inputs, map_over, map_mode)
    settings = map_settings(plan, session_id, select, on_error, cache, callbacks, budget,
                            on_budget)
    if n == 0:
        return MapResult([], session_id=settings.session_id)
    loop = None
    if batch_nodes(plan):  # before anything runs: its folder, clients and transports
        loop = open_loop(plan, settings, broadcast, list(columns), None,
                         map_identity(plan, columns, sorted(broadcast), settings.select),
                         engine.driver_shared)
    prepare_map_cache(plan, cache, engine)
    job = MapJob(plan, columns, broadcast, n, settings)
    collector = MapCollector(job, callbacks, progress, engine.name)
    asker = Asker(settings.budget, on_budget, engine.driver_shared, collector.budget)
    pending = 0
    with collector.watch(engine, settings), stopping(settings.run_prefix):
        with asker:  # exited first: calls parked on the budget are refused, then waited for
            if loop is None:
                engine.execute_map(job, collector.accept)
            else:
                loop.on_change = collector.batch_states
                loop.on_event = collector.dispatch
                pending = loop.run(Rounds(job, engine, collector), wait)
        asker.raise_error()
    result = collector.result()
    result.pending = pending
    return result



def reject_interrupts(plan: Plan) -> None:
    """``TypeError`` for a map over a graph with an ``InterruptNode`` (nested ones too)."""
    if plan.interrupts:
        names = ", ".join(
            f"{n.name!r} inside nested graph {plan.nested_in[n.name]!r}"
            if n.name in plan.nested_in else repr(n.name) for n in plan.interrupts)
        raise TypeError(
            f"map() cannot run a graph with an InterruptNode ({names}); answer interrupts in "
            "run()/iter() per item instead"
        )


class MapCollector(Tally):
    """Receives batches in any order; dispatches their events; builds the ordered result."""

    def __init__(self, job: MapJob, callbacks: Sequence[Any], progress: bool, engine: str):
        s = job.settings
        super().__init__(callbacks, progress, job.n, f"map [{engine}]",
                         budget=dict(s.budget.limits) if s.budget is not None else None,
                         kept=Kept("cache" if s.cache is not None else ""))
        self.job = job
        self.batches: list[BatchResult] = []
        self.waiting: set[int] = set()  # items waiting for a provider batch
        self.moved: dict[int, _Moved] = {}  # item -> its result in a later round

    def accept(self, batch: BatchResult) -> None:
        self.batches.append(batch)
        self.waiting.update(batch.offset + i for i in batch.waiting)
        self._count(batch, batch.offset)

    def accept_again(self, items: Sequence[int], batch: BatchResult) -> None:
        """A batch of a later round (``items``: the map's index of each position; when
        consecutive, its events are moved to the items they belong to)."""
        if isinstance(items, range):
            for event in batch.events:
                if isinstance(event, BatchEvent):
                    event.offset = items[event.offset]
        waits = set(batch.waiting)
        for i in range(batch.n):
            if i not in waits:
                item = items[batch.offset + i]
                self.waiting.discard(item)
                self.moved[item] = _Moved(batch, i, item)
        self._count(batch, None)

    def _count(self, batch: BatchResult, offset: int | None) -> None:
        refused = sum(1 for e in batch.errors.values() if is_budget(e)) if self.budget else 0
        self.add(batch.n - len(batch.waiting), batch.hits, len(batch.errors), batch.events,
                 batch.usage_totals(), offset, refused)
        batch.events = []
        if offset is not None and batch.waiting:  # live counts of later rounds: not here
            with self._lock:
                self.exact.add(offset, offset + batch.n)

    def result(self) -> MapResult:
        batches = sorted(self.batches, key=lambda b: b.offset)
        covered = sum(b.n for b in batches)
        if covered != self.job.n:
            raise RuntimeError(
                f"internal error: the engine returned {covered} of {self.job.n} items"
            )
        session = self.job.settings.session_id
        from_row = GraphResult.from_row
        results: list[GraphResult] = []
        for b in batches:
            errors = b.errors
            if b.waiting:
                results.extend([self._later(b, i, session) for i in range(b.n)])
            elif errors:
                results.extend([from_row(b, i, session, errors.get(i)) for i in range(b.n)])
            else:
                results.extend([from_row(b, i, session) for i in range(b.n)])
        moved = self.moved
        return MapResult(results, columns=lambda: _columns(batches, moved), session_id=session,
                         usage=self.usage, resumed=sum(b.all_hits() for b in batches))

    def _later(self, b: BatchResult, i: int, session: str) -> GraphResult:
        """Item ``i`` of a batch where some items waited: its result in a later round, or
        still waiting (``status == "pending"``)."""
        item = b.offset + i
        later = self.moved.get(item)
        if later is not None:
            return GraphResult.from_row(later, 0, session, later.batch.errors.get(later.i))
        r = GraphResult.from_row(b, i, session, b.errors.get(i))
        if item in self.waiting:
            r.status, r._outputs = "pending", {}
        return r


class _Moved:
    """Item ``item``'s result, computed at position ``i`` of a later round's ``batch``."""

    __slots__ = ("batch", "i", "offset")

    def __init__(self, batch: BatchResult, i: int, item: int) -> None:
        self.batch, self.i, self.offset = batch, i, item

    def row(self, _: int) -> dict[str, Any]:
        return self.batch.row(self.i)

    def history_of(self, _: int) -> list[Any]:
        return self.batch.history_of(self.i)

    def run_id_of(self, _: int) -> str:
        return f"{self.batch.run_prefix}{self.offset}"


def _columns(batches: list[BatchResult], moved: Mapping[int, _Moved] | None = None
             ) -> dict[str, list[Any]]:
    names: dict[str, None] = {}
    for b in batches:
        names.update(dict.fromkeys(b.outputs))
    table: dict[str, list[Any]] = {}
    for name in names:
        col: list[Any] = []
        for b in batches:
            values = b.outputs.get(name)
            col.extend([None] * b.n if values is None else
                       (None if v is MISSING else v for v in values))
        table[name] = col
    for item, later in (moved or {}).items():  # items finished in a later round
        for name, col in table.items():
            values = later.batch.outputs.get(name)
            value = MISSING if values is None else values[later.i]
            col[item] = None if value is MISSING else value
    return table
