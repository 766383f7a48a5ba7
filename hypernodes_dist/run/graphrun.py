"""``GraphRun``: the interactive run behind ``graph.iter()``.

```python
async with graph.iter(inputs={"topic": "AI"}) as run:
    async for event in run:
        if isinstance(event, StreamingChunkEvent):
            print(event.chunk, end="")
        if run.interrupted:
            await run.respond({"user_decision": ask(run.interrupt.value)})
print(run.result["final"])
```

Mechanics. One *producer* task drives the same ``LocalRun`` that ``run()`` uses
(``begin`` / ``advance`` / ``finish``: no second executor); its event sink appends to a queue
that the ``async for`` consumer drains. Streamed chunks apply back-pressure: the sink returns
a future that completes when the consumer takes the chunk, and the scheduler awaits it, so
a streaming node advances one chunk per chunk consumed (concurrent streams interleave).
When the run pauses at an interrupt with no handler, the producer waits for ``respond()``;
the consumer sees the ``InterruptEvent`` and ``run.interrupted`` becomes true. If it asks
for the next event without answering, iteration stops (the run stays paused: answer and
iterate again, or take ``run.checkpoint()`` and leave). A paused run never ends by itself:
the whole interactive session is one run, with one ``RunStartEvent`` and one
``RunEndEvent``. Leaving the ``async with`` block while paused ends it with status
``"interrupted"``; leaving it mid-run cancels the run (``RunEndEvent(status="cancelled")``,
executions in flight are forgotten, so a checkpoint resumes by re-running them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

from hypernodes_dist.events import Event, InterruptEvent, StreamingChunkEvent
from hypernodes_dist.execution.scheduler import validate_response
from hypernodes_dist.results import GraphResult
from hypernodes_dist.run.checkpoint import Checkpoint
from hypernodes_dist.run.runner import Interrupt, LocalRun, responses_for

__all__ = ["GraphRun"]


class GraphRun:
    """Async context manager and async iterator of a run's events (see the module doc)."""

    def __init__(self, run: LocalRun) -> None:
        self._run = run
        run.sink = self._put
        self._queue: deque[tuple[Event, asyncio.Future[None] | None]] = deque()
        self._wakeup: asyncio.Event | None = None
        self._answered: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiting = False  # the producer is paused, waiting for respond()
        self._interrupt: Interrupt | None = None  # as the consumer has seen it
        self._result: GraphResult | None = None
        self._error: BaseException | None = None
        self._error_raised = False
        self._closed = False

    # ------------------------------------------------------------------ identity
    @property
    def session_id(self) -> str:
        return self._run.session_id

    @property
    def run_id(self) -> str:
        return self._run.run_id

    # ------------------------------------------------------------------ producer
    def _start(self) -> None:
        if self._task is not None:
            return
        if self._closed:
            raise RuntimeError("this GraphRun is closed")
        loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._answered = asyncio.Event()
        self._run.begin()
        self._task = loop.create_task(self._produce(), name=f"hypernodes-iter-{self.run_id}")

    async def _produce(self) -> None:
        run = self._run
        assert self._answered is not None
        try:
            while True:
                try:
                    status = await run.advance()
                except Exception as exc:
                    self._error = exc
                    self._result = run.finish("error")
                    return
                if status != "interrupted":
                    self._result = run.finish(status)
                    return
                self._waiting = True
                self._wake()
                await self._answered.wait()
                self._answered.clear()
                self._waiting = False
        finally:
            self._wake()

    def _put(self, event: Event) -> Any:
        fut: asyncio.Future[None] | None = None
        if isinstance(event, StreamingChunkEvent):
            fut = asyncio.get_running_loop().create_future()
        self._queue.append((event, fut))
        self._wake()
        return fut

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    # ------------------------------------------------------------------ consumer
    async def __aenter__(self) -> GraphRun:
        self._start()
        return self

    def __aiter__(self) -> GraphRun:
        return self

    async def __anext__(self) -> Event:
        self._start()
        assert self._wakeup is not None and self._task is not None
        while True:
            if self._queue:
                event, fut = self._queue.popleft()
                if fut is not None and not fut.done():
                    fut.set_result(None)
                if isinstance(event, InterruptEvent) and event.parent_run_id is None:
                    node = self._run.graph.plan.interrupt(event.interrupt_name)
                    self._interrupt = Interrupt(event.interrupt_name, event.value,
                                                node.response_param)
                return event
            if self._task.done() or (self._waiting and self._interrupt is not None
                                     and not self._answered.is_set()):  # type: ignore[union-attr]  # _answered is set whenever _waiting is
                if self._error is not None and not self._error_raised:
                    self._error_raised = True
                    raise self._error
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()

    async def respond(self, response: dict[str, Any]) -> None:
        """Answer the pending interrupt with ``{response_param: value}``; the run continues."""
        pending = self._interrupt
        if pending is None:
            raise RuntimeError("respond() needs a paused run: no interrupt is pending")
        answers = responses_for(self._run.graph, response)
        if pending.name not in answers:
            raise ValueError(
                f"the pending interrupt {pending.name!r} is answered with "
                f"{{{pending.response_param!r}: ...}}, got keys {sorted(response)}"
            )
        plan = self._run.graph.plan
        answers = {name: validate_response(plan.interrupt(name), v) for name, v in answers.items()}
        self._run.state.responses.update(answers)
        self._interrupt = None
        assert self._answered is not None
        self._answered.set()
        await asyncio.sleep(0)

    # ------------------------------------------------------------------ views
    @property
    def interrupted(self) -> bool:
        """True from the ``InterruptEvent`` until ``respond()``."""
        return self._interrupt is not None

    @property
    def interrupt(self) -> Interrupt | None:
        """The pending interrupt (``.name``, ``.value``, ``.response_param``) or None."""
        return self._interrupt

    @property
    def state(self) -> dict[str, Any]:
        """The run's current values (inputs and outputs), a copy."""
        return dict(self._run.state.values)

    @property
    def result(self) -> GraphResult | None:
        """The ``GraphResult`` once the run finished (or is paused); None while running."""
        if self._result is not None:
            return self._result
        if self._interrupt is not None:
            return self._run.result("interrupted")
        return None

    @property
    def status(self) -> str:
        if self._result is not None:
            return self._result.status
        return "interrupted" if self._interrupt is not None else "running"

    def checkpoint(self) -> Checkpoint:
        """A checkpoint of the run as it stands (only the values needed to resume)."""
        return self._run.checkpoint()

    # ------------------------------------------------------------------ closing
    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End the interactive run (see the module doc); idempotent."""
        if self._closed:
            return
        self._closed = True
        task = self._task
        if task is None or task.done():
            return
        paused = self._waiting
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for _, fut in self._queue:
            if fut is not None and not fut.done():
                fut.cancel()
        run = self._run
        if paused:
            self._result = run.finish("interrupted")
        else:
            run.status = None
            run._persist()
            run._end(run._emitter(), "cancelled", None)

    def __repr__(self) -> str:
        return f"GraphRun(run_id={self.run_id!r}, status={self.status!r})"
