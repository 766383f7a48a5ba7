"""One run of a graph in this process: ``run()``/``arun()`` and the runs behind ``iter()``.

``LocalRun`` owns a ``RunState`` and drives the ``Scheduler`` over it; an interrupted run
keeps its state, so ``resume`` continues the same run (same ``run_id``) without re-running
completed nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .events import Event, RunEndEvent, RunStartEvent, dispatch
from .keys import Keys
from .results import GraphResult
from .scheduler import RunContext, RunState, Scheduler

if TYPE_CHECKING:
    from .graph import Graph

__all__ = ["Interrupt", "LocalRun", "responses_for"]


@dataclass(frozen=True)
class Interrupt:
    """A pending interrupt: its ``name``, the ``value`` it surfaces and where the answer goes."""

    name: str
    value: Any
    response_param: str


def responses_for(graph: Graph, given: Mapping[str, Any]) -> dict[str, Any]:
    """``{response_param: value}`` -> ``{interrupt name: value}``; unknown names are errors."""
    by_param = {n.response_param: n.name for n in graph.plan.interrupts}  # type: ignore[attr-defined]
    unknown = [k for k in given if k not in by_param]
    if unknown:
        known = ", ".join(by_param) or "none"
        raise ValueError(
            f"{', '.join(map(repr, unknown))} answer(s) no interrupt; response parameters: {known}"
        )
    return {by_param[k]: v for k, v in given.items()}


class LocalRun:
    """A run of ``graph`` over ``state``; ``execute()`` runs it until it stops."""

    def __init__(
        self,
        graph: Graph,
        state: RunState,
        *,
        session_id: str,
        run_id: str,
        handlers: Mapping[str, Callable[[Any], Any]] | None = None,
        select: tuple[str, ...] | None = None,
        on_error: str = "raise",
        sink: Callable[[Event], Any] | None = None,
    ) -> None:
        self.graph = graph
        self.state = state
        self.session_id = session_id
        self.run_id = run_id
        self.handlers = {**graph.handlers, **(handlers or {})}
        self.select = select
        self.on_error = on_error
        self.sink = sink
        self.error: BaseException | None = None

    def emit(self, event: Event) -> Any:
        if self.graph.callbacks:
            dispatch(self.graph.callbacks, event)
        if self.sink is not None:
            return self.sink(event)
        return None

    def _emitter(self) -> Callable[[Event], Any] | None:
        return self.emit if (self.graph.callbacks or self.sink is not None) else None

    async def execute(self) -> GraphResult:
        graph, state = self.graph, self.state
        emit = self._emitter()
        engine = graph.engine
        ctx = RunContext(
            self.session_id,
            self.run_id,
            emit=emit,
            keys=Keys(graph.plan, graph.cache) if graph.cache is not None else None,
            handlers=self.handlers,
            parallel=engine.parallel_nodes,
            max_workers=engine.max_workers,
        )
        t0 = time.perf_counter()
        if emit:
            emit(RunStartEvent(session_id=self.session_id, run_id=self.run_id,
                               inputs=dict(state.values), graph_id=graph.plan.graph_hash))
        state.pending_interrupt = None
        try:
            await Scheduler(graph.plan, state, ctx).run()
        except Exception as exc:
            if self.on_error == "raise":
                self._end(emit, "error", t0, exc)
                raise
            self.error = exc
        status = "error" if self.error else "interrupted" if state.pending_interrupt else "complete"
        self._end(emit, status, t0, self.error)
        return self.result(status)

    def _end(self, emit: Any, status: str, t0: float, error: BaseException | None) -> None:
        if emit:
            emit(RunEndEvent(session_id=self.session_id, run_id=self.run_id, status=status,
                             outputs=self.state.outputs(), error=error,
                             duration_ms=(time.perf_counter() - t0) * 1e3))

    def pending(self) -> Interrupt | None:
        name = self.state.pending_interrupt
        if name is None:
            return None
        node = self.graph.plan.by_name[name]
        return Interrupt(name, self.state.values.get(node.input_param), node.response_param)  # type: ignore[attr-defined]

    def result(self, status: str) -> GraphResult:
        outputs = self.state.outputs()
        if self.select is not None:
            outputs = {k: outputs[k] for k in self.select if k in outputs}
        interrupt = self.pending() if status == "interrupted" else None
        return GraphResult(
            outputs,
            session_id=self.session_id,
            run_id=self.run_id,
            status=status,  # type: ignore[arg-type]
            history=list(self.state.history),
            error=self.error,
            interrupt=interrupt,
            checkpoint=self.graph._checkpoint_of(self) if interrupt else None,
            resume=self._resume if interrupt else None,
        )

    def _resume(self, response: dict[str, Any]) -> GraphResult:
        return self.graph.run(response, checkpoint=self.graph._checkpoint_of(self),
                              session_id=self.session_id, handlers=self.handlers,
                              select=self.select, on_error=self.on_error)
