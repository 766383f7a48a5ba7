"""graph.iter(): GraphRun as async context manager + async iterator of events."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hypernodes_dist import Graph, node
from hypernodes_dist.engines.base import Engine
from hypernodes_dist.events import (
    InterruptEvent,
    NodeEndEvent,
    ResumeEvent,
    RunEndEvent,
    RunStartEvent,
    StreamingChunkEvent,
)
from hypernodes_dist.run.checkpointers import MemoryCheckpointer

from . import hitl
from .hitl import ApprovalResponse, make_graph


class Recorder:
    def __init__(self) -> None:
        self.events: list = []

    def on_event(self, event) -> None:
        self.events.append(event)


def test_draft_review_revise_loop_three_rounds_through_iter():
    answers = [
        ApprovalResponse("revise", "add sources"),
        ApprovalResponse("revise", "shorter"),
        ApprovalResponse("approve"),
    ]
    rec = Recorder()
    g = make_graph(callbacks=[rec])

    async def go():
        reviewed = []
        events = []
        async with g.iter(inputs={"topic": "AI Safety"}) as run:
            assert run.result is None and not run.interrupted
            async for event in run:
                events.append(event)
                if run.interrupted:
                    assert isinstance(event, InterruptEvent)
                    assert run.interrupt.name == "approval"
                    assert run.state["approval_prompt"] == run.interrupt.value
                    reviewed.append(run.interrupt.value.draft)
                    await run.respond({"user_decision": answers[len(reviewed) - 1]})
                    assert not run.interrupted
        return run, reviewed, events

    run, reviewed, events = asyncio.run(go())
    assert reviewed == [
        "draft on AI Safety",
        "draft on AI Safety [add sources]",
        "draft on AI Safety [add sources] [shorter]",
    ]
    assert run.result.status == "complete"
    assert run.result["final"] == "DRAFT ON AI SAFETY [ADD SOURCES] [SHORTER]"
    # one run: one start, one end, one run_id, step_index never goes back
    assert sum(isinstance(e, RunStartEvent) for e in events) == 1
    assert isinstance(events[-1], RunEndEvent) and events[-1].status == "complete"
    assert {e.run_id for e in events} == {run.run_id}
    assert sum(isinstance(e, ResumeEvent) for e in events) == 3
    steps = [e.step_index for e in events if isinstance(e, NodeEndEvent)]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    revs = [h for h in run.result.history if h.node_id == "revise"]
    assert [h.iteration for h in revs] == [0, 1]
    # callbacks receive the very same events
    assert [type(e) for e in rec.events] == [type(e) for e in events]


def test_iteration_stops_at_an_unanswered_pause_and_continues_after_respond():
    g = make_graph()

    async def go():
        async with g.iter(inputs={"topic": "x"}) as run:
            first = [type(e).__name__ async for e in run]
            assert run.interrupted and first[-1] == "InterruptEvent"
            paused = run.result
            assert paused.status == "interrupted" and paused.interrupt.name == "approval"
            with pytest.raises(ValueError, match="user_decision"):
                await run.respond({})
            with pytest.raises(TypeError):
                await run.respond({"user_decision": 3})
            await run.respond({"user_decision": ApprovalResponse("approve")})
            with pytest.raises(RuntimeError):
                await run.respond({"user_decision": ApprovalResponse("approve")})
            second = [type(e).__name__ async for e in run]
        return run, second

    run, second = asyncio.run(go())
    assert second[0] == "ResumeEvent" and second[-1] == "RunEndEvent"
    assert run.result["final"] == "DRAFT ON X"


def test_checkpoint_at_a_pause_then_resume_in_a_new_iter():
    g = make_graph()

    async def first():
        async with g.iter(inputs={"topic": "cp"}) as run:
            async for _ in run:
                if run.interrupted:
                    saved = run.checkpoint()
                    break
        return saved, run.run_id

    async def later(saved):
        async with g.iter(checkpoint=saved) as run:
            async for _ in run:
                if run.interrupted:
                    await run.respond({"user_decision": ApprovalResponse("approve")})
        return run

    hitl.CALLS.clear()
    saved, run_id = asyncio.run(first())
    assert saved.pending_interrupt == "approval" and saved.status == "interrupted"
    assert hitl.CALLS == ["generate_draft", "create_prompt"]
    run = asyncio.run(later(saved))
    assert run.run_id == run_id and run.result["final"] == "DRAFT ON CP"
    assert hitl.CALLS == ["generate_draft", "create_prompt", "finalize"]  # nothing re-ran


def test_iter_resume_by_session_id_with_answer_up_front():
    g = make_graph(checkpointer=MemoryCheckpointer())
    r = g.run({"topic": "s"}, session_id="sess-iter")
    assert r.interrupted

    async def go():
        async with g.iter(inputs={"user_decision": ApprovalResponse("approve")},
                          session_id="sess-iter", resume=True) as run:
            kinds = [type(e).__name__ async for e in run]
        return kinds, run

    kinds, run = asyncio.run(go())
    assert "InterruptEvent" not in kinds and run.run_id == r.run_id
    assert run.result["final"] == "DRAFT ON S"


def test_node_error_surfaces_from_iteration():
    @node(output_name="y")
    def bad(x: int) -> int:
        raise ZeroDivisionError("nope")

    async def go():
        kinds = []
        async with Graph([bad]).iter(inputs={"x": 1}) as run:
            with pytest.raises(ZeroDivisionError):
                async for e in run:
                    kinds.append(type(e).__name__)
        return kinds, run

    kinds, run = asyncio.run(go())
    assert kinds[-2:] == ["NodeErrorEvent", "RunEndEvent"]
    assert run.result.status == "error" and isinstance(run.result.error, ZeroDivisionError)


def test_leaving_the_block_mid_run_cancels_it():
    @node(output_name="text")
    async def endless(n: int):
        i = 0
        while True:
            await asyncio.sleep(0)
            yield str(i)
            i += 1

    rec = Recorder()
    g = Graph([endless], callbacks=[rec])

    async def go():
        async with g.iter(inputs={"n": 1}) as run:
            async for e in run:
                if isinstance(e, StreamingChunkEvent) and e.chunk_index == 3:
                    ckpt = run.checkpoint()
                    break
        return run, ckpt

    run, ckpt = asyncio.run(go())
    assert rec.events[-1].status == "cancelled"
    # the node in flight is not recorded as run: resuming would run it again
    assert ckpt.status == "running" and "endless" not in ckpt.scheduler["counts"]
    assert run.result is None


def test_iter_async_iteration_without_context_manager():
    g = Graph([hitl.generate_draft])

    async def go():
        run = g.iter({"topic": "q"})
        kinds = [type(e).__name__ async for e in run]
        await run.aclose()
        return kinds, run.result

    kinds, result = asyncio.run(go())
    assert kinds[0] == "RunStartEvent" and result["draft"] == "draft on q"


def test_iter_on_an_engine_without_iter_support_raises_type_error_naming_it():
    class BatchOnly(Engine):
        name = "batchonly"

    g = Graph([hitl.generate_draft], engine=BatchOnly())
    with pytest.raises(TypeError, match="BatchOnly"):
        g.iter({"topic": "x"})


def test_human_review_example_runs_three_rounds(tmp_path, capsys):
    import argparse
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / "human_review.py"
    spec = importlib.util.spec_from_file_location("human_review_example", path)
    mod = importlib.util.module_from_spec(spec)
    import sys

    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    args = argparse.Namespace(topic="t", session="s", interactive=False, stop=False,
                              resume=False)
    asyncio.run(mod.drive(mod.build(tmp_path / "r.db"), args))
    out = capsys.readouterr().out
    assert out.count("requested") == 3 and "final: A short note on t. (cite sources)" in out
