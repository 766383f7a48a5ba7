"""The shared plan executor: runs one batch of map items and returns a ``BatchResult``.

Every engine calls ``execute_batch`` — the local engine in the driver, a Dask task on a
worker, a Daft UDF on a partition — so all engines share one semantics and one cache-key
scheme. Three strategies, chosen by the plan:

- *item flow* (``flow.py``; acyclic plans with async nodes or waiting policies): each
  item walks the plan on its own, so an item that waits holds back no other;
- *columnar* (``columnar.py``; other acyclic plans, branches and gates decided per item):
  node by node over the whole batch, one C-level ``map`` per sync node; chained cache
  keys, so a warm batch fetches only its outputs;
- *per item* (here): the reactive ``Scheduler`` runs each item (cycles, interrupts, a
  gate that can ``END`` beside nodes unrelated to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from hypernodes_dist.cache.keys import Keys, WriteBuffer, batch_writes
from hypernodes_dist.errors import WaitingForBatch, portable
from hypernodes_dist.events import RunEndEvent, RunStartEvent
from hypernodes_dist.execution.batchwait import LINK, BatchLink
from hypernodes_dist.execution.columnar import run_columnar
from hypernodes_dist.execution.context import worker_id
from hypernodes_dist.execution.flow import run_flow
from hypernodes_dist.execution.job import BatchResult, BatchSettings, Chunk, Paused, RunsResult
from hypernodes_dist.execution.progress import ticker
from hypernodes_dist.execution.running import batch_of
from hypernodes_dist.execution.runstate import RunContext, RunState
from hypernodes_dist.execution.scheduler import Scheduler
from hypernodes_dist.execution.syncio import run_sync
from hypernodes_dist.missing import MISSING
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.usage import add_usage
from hypernodes_dist.results import NodeExecution

__all__ = ["execute_batch", "run_batch", "batch_round"]

def execute_batch(
    plan: Plan, chunk: Chunk, settings: BatchSettings, writes: WriteBuffer | None = None
) -> BatchResult:
    """Run every item of ``chunk`` through ``plan``; see the module docstring.

    ``writes``: a cache write buffer shared by consecutive batches of one caller, who
    flushes it at the end (fewer, larger transactions); by default each batch has its own.
    """
    return run_sync(run_batch(plan, chunk, settings, writes),
                    needs_loop=plan.is_async or plan.flows)


async def run_batch(
    plan: Plan, chunk: Chunk, settings: BatchSettings, writes: WriteBuffer | None = None
) -> BatchResult:
    """``execute_batch`` as a coroutine, for callers already inside an event loop."""
    link = LINK.set(settings.batch)  # batch_api nodes record and read answers there
    try:
        with batch_of(settings.run_prefix) as halt, batch_round(settings.batch), \
                batch_writes(settings.cache, writes) as buffer:
            if plan.flows:
                result: BatchResult = await run_flow(plan, chunk, settings, buffer, halt)
            elif plan.columnar:
                result = await run_columnar(plan, chunk, settings, buffer)
            else:
                result = await _per_item(plan, chunk, settings, buffer)
    finally:
        LINK.reset(link)
    result.worker = worker_id()
    result.run_prefix = settings.run_prefix
    if settings.progress is not None:
        ticker(settings.progress).tick(chunk.offset, chunk.n)
    return result


@contextlib.contextmanager
def batch_round(link: BatchLink | None) -> Iterator[None]:
    """The rows of a map with batches run a round of it: this process's request log holds
    its lines until the round ends, its answer store reads the settled folder once
    (``RequestLog.round``, ``AnswerStore.round``)."""
    if link is None:
        yield
        return
    log, answers = link.stores()
    with log.round(), answers.round():
        yield


# ============================================================================ per item


async def _per_item(
    plan: Plan, chunk: Chunk, settings: BatchSettings, writes: WriteBuffer | None
) -> RunsResult:
    keys = Keys(plan, settings.cache) if settings.cache is not None else None
    wanted = settings.select or plan.outputs
    result = RunsResult(chunk.offset, chunk.n, {k: [MISSING] * chunk.n for k in wanted},
                        histories=[[] for _ in range(chunk.n)])
    running: dict[str, Any] | None = {} if keys is not None and plan.is_async else None
    emit = result.events.append if settings.want_events else None
    ticks = ticker(settings.progress) if settings.progress is not None else None
    finished = 0
    metered: dict[str, float] = {}

    async def one(i: int) -> None:
        nonlocal finished
        index = settings.item(chunk.offset + i)  # the map's item (a later round's too)
        ctx = RunContext(settings.session_id, f"{settings.run_prefix}{index}", emit=emit,
                         keys=keys, writes=writes, item_index=index, running=running,
                         handlers=settings.handlers or {}, budget=settings.budget)
        state = RunState.start(chunk.item(i))
        if settings.responses:
            state.responses.update(settings.responses)
        await _run_item(plan, state, ctx, result, i, settings)
        finished += 1
        if ticks is not None:
            for execution in state.history:
                add_usage(metered, execution.usage or {})
            ticks.tick(chunk.offset, finished, metered)

    if plan.is_async:
        sem = asyncio.Semaphore(settings.concurrency or chunk.n)

        async def bounded(i: int) -> None:
            async with sem:
                await one(i)

        await asyncio.gather(*(bounded(i) for i in range(chunk.n)))
    else:
        for i in range(chunk.n):
            await one(i)
    return result


async def _run_item(plan: Plan, state: RunState, ctx: RunContext, result: RunsResult, i: int,
                    settings: BatchSettings) -> None:
    """Item ``i`` through the reactive scheduler, its outcome kept in ``result``."""
    emit, t0 = ctx.emit, time.perf_counter()
    if emit:
        emit(RunStartEvent(session_id=ctx.session_id, run_id=ctx.run_id, item_index=ctx.item_index,
                           inputs=dict(state.values), graph_id=plan.graph_hash))
    error = None
    try:
        await Scheduler(plan, state, ctx).run()
    except WaitingForBatch:
        result.waiting.append(i)
    except Exception as exc:
        error = _fail(exc, settings)
        result.errors[i] = error
    pending = state.pending_interrupt
    if pending is not None:  # a nested graph's run (map rejects these)
        result.paused[i] = Paused(pending, state.pending_value if pending not in plan.by_name
                                  else state.values.get(plan.by_name[pending].params[0]))
    for k, col in result.outputs.items():
        col[i] = state.values.get(k, MISSING) if k in state.produced else MISSING
    _keep_history(result, i, state.history, settings.select)
    if emit:
        emit(RunEndEvent(session_id=ctx.session_id, run_id=ctx.run_id, item_index=ctx.item_index,
                         status="error" if error else "interrupted" if pending else "complete",
                         error=error, outputs=state.outputs(),
                         duration_ms=(time.perf_counter() - t0) * 1e3))


def _keep_history(result: RunsResult, i: int, history: list[NodeExecution],
                  select: tuple[str, ...] | None) -> None:
    """Item ``i``'s executions into ``result``: its history (with the outputs the map
    returns), the counts, and what each call metered (the usage path every result takes)."""
    for execution in history:
        if select is not None:
            execution.outputs = {k: v for k, v in execution.outputs.items() if k in select}
        if execution.cached:
            result.hits += 1
            continue
        result.executed += 1
        name = execution.node_id
        result.calls[name] = result.calls.get(name, 0) + 1
        if execution.usage:
            add_usage(result.usage.setdefault(name, {}).setdefault(i, {}), execution.usage)
    result.histories[i] = history


def _fail(exc: BaseException, settings: BatchSettings) -> BaseException:
    if settings.on_error == "raise":
        raise exc
    return portable(exc)

