"""``map``: expand inputs into a ``MapJob``, hand it to the engine, assemble the ``MapResult``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hypernodes_dist.cache.base import Cache, prepare_cache
from hypernodes_dist.engines.base import Engine
from hypernodes_dist.events import wants_events
from hypernodes_dist.execution.job import BatchResult, BatchSettings, MapJob
from hypernodes_dist.inputs import check_on_error, check_select, expand, new_run_id, new_session_id
from hypernodes_dist.missing import MISSING
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.budget import check_budget
from hypernodes_dist.results import GraphResult, MapResult
from hypernodes_dist.run.onbudget import Ask, Asker
from hypernodes_dist.run.progress import Tally
from hypernodes_dist.run.stops import Kept, is_budget

__all__ = ["run_map", "MapCollector", "reject_interrupts"]



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
) -> MapResult:
    """Run every item of a map on ``engine``; results in item order."""
    reject_interrupts(plan)
    columns, broadcast, n = expand(plan, inputs, map_over, map_mode)
    run_prefix = new_run_id() + "-"
    settings = BatchSettings(
        session_id=session_id or new_session_id(),
        run_prefix=run_prefix,
        select=check_select(plan, select),
        on_error=check_on_error(on_error),
        cache=cache,
        want_events=wants_events(callbacks),
        budget=check_budget(budget, run_prefix, on_budget),
    )
    if n == 0:
        return MapResult([], session_id=settings.session_id)
    if cache is not None:
        plan.code_ids()  # hash node code once, in the driver; workers get it with the plan
        prepare_cache(cache, engine)  # every worker must see the store (Cache protocol)
    job = MapJob(plan, columns, broadcast, n, settings)
    collector = MapCollector(job, callbacks, progress, engine.name)
    asker = Asker(settings.budget, on_budget, engine.driver_shared, collector.budget)
    with collector.watch(engine, settings):
        with asker:
            engine.execute_map(job, collector.accept)
        asker.raise_error()
    return collector.result()



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

    def accept(self, batch: BatchResult) -> None:
        self.batches.append(batch)
        refused = sum(1 for e in batch.errors.values() if is_budget(e)) if self.budget else 0
        self.add(batch.n, batch.hits, len(batch.errors), batch.events, batch.usage_totals(),
                 batch.offset, refused)
        batch.events = []

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
            if errors:
                results.extend([from_row(b, i, session, errors.get(i)) for i in range(b.n)])
            else:
                results.extend([from_row(b, i, session) for i in range(b.n)])
        return MapResult(results, columns=lambda: _columns(batches), session_id=session,
                         usage=self.usage, resumed=sum(b.all_hits() for b in batches))


def _columns(batches: list[BatchResult]) -> dict[str, list[Any]]:
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
    return table
