"""Interrupts: handlers (graph.on_interrupt, run(handlers=), sync or async), surfaced
interrupts with resume, response_type validation; an interrupt inside a nested graph pauses
the outer run (README: "Semantics the contract leaves open"), and map rejects it."""

from __future__ import annotations

import asyncio

import pytest

from hypernodes_dist import Graph, InterruptNode, node
from hypernodes_dist.events import InterruptEvent, ResumeEvent
from hypernodes_dist.persistence import MemoryCheckpointer

from .conformance import edge_graphs as E
from .hitl import ApprovalPrompt, ApprovalResponse, make_graph


class Recorder:
    def __init__(self) -> None:
        self.events: list = []

    def on_event(self, event) -> None:
        self.events.append(event)


def test_no_handler_surfaces_the_interrupt_and_resume_continues():
    rec = Recorder()
    g = make_graph(callbacks=[rec])
    r = g.run({"topic": "AI"})
    assert r.status == "interrupted" and r.interrupted
    assert r.interrupt.name == "approval"
    assert r.interrupt.value == ApprovalPrompt("Approve?", "draft on AI")
    assert r.checkpoint is not None and r.checkpoint.pending_interrupt == "approval"
    ev = next(e for e in rec.events if isinstance(e, InterruptEvent))
    assert ev.interrupt_name == "approval" and ev.checkpoint_id == r.checkpoint.checkpoint_id
    assert rec.events[-1].status == "interrupted"

    r2 = r.resume({"user_decision": ApprovalResponse("revise", "shorter")})
    assert r2.interrupted and r2.run_id == r.run_id and r2.session_id == r.session_id
    assert r2.interrupt.value.draft == "draft on AI [shorter]"
    resume_ev = [e for e in rec.events if isinstance(e, ResumeEvent)]
    assert resume_ev[-1].response_value == ApprovalResponse("revise", "shorter")

    r3 = r2.resume({"user_decision": ApprovalResponse("approve")})
    assert r3.status == "complete" and r3["final"] == "DRAFT ON AI [SHORTER]"
    with pytest.raises(RuntimeError):
        r3.resume({"user_decision": ApprovalResponse("approve")})


def test_on_interrupt_decorator_with_an_async_handler():
    g = make_graph()
    seen = []

    @g.on_interrupt("approval")
    async def handle(prompt: ApprovalPrompt) -> ApprovalResponse:
        await asyncio.sleep(0)
        seen.append(prompt.draft)
        return ApprovalResponse("approve") if len(seen) == 2 else ApprovalResponse("no", "more")

    r = g.run({"topic": "t"})
    assert r.status == "complete" and r["final"] == "DRAFT ON T [MORE]"
    assert seen == ["draft on t", "draft on t [more]"]


def test_inline_sync_handler_overrides_and_works_in_arun():
    g = make_graph()
    g.on_interrupt("approval")(lambda p: ApprovalResponse("no", "ignored"))
    r = asyncio.run(g.arun({"topic": "t"}, handlers={"approval": lambda p: {"choice": "approve"}}))
    # a dict response is coerced into response_type
    assert r["final"] == "DRAFT ON T" and r["user_decision"] == ApprovalResponse("approve")


def test_unknown_interrupt_name_is_rejected():
    with pytest.raises(ValueError, match="approval"):
        make_graph().on_interrupt("nope")


def test_response_type_is_validated():
    g = make_graph()
    r = g.run({"topic": "t"})
    with pytest.raises(TypeError, match="ApprovalResponse"):
        r.resume({"user_decision": "approve"})
    with pytest.raises(TypeError, match="user_decision"):
        g.run({"topic": "t"}, handlers={"approval": lambda p: 42})
    with pytest.raises(ValueError, match="no interrupt"):
        r.resume({"not_a_param": 1})


def test_response_given_up_front_answers_the_interrupt():
    r = make_graph().run({"topic": "t", "user_decision": ApprovalResponse("approve")})
    assert r.status == "complete" and r["final"] == "DRAFT ON T"


def test_interrupt_without_response_type_accepts_anything():
    @node(output_name="q")
    def ask(x: int) -> str:
        return f"ok {x}?"

    confirm = InterruptNode(name="confirm", input_param="q", response_param="answer")

    @node(output_name="out")
    def use(answer, x: int):
        return (answer, x)

    g = Graph([ask, confirm, use])
    r = g.run({"x": 1})
    assert r.interrupt.value == "ok 1?"
    assert r.resume({"answer": None})["out"] == (None, 1)


def test_handlers_answer_in_iter_too():
    g = make_graph()
    g.on_interrupt("approval")(lambda p: ApprovalResponse("approve"))

    async def go():
        async with g.iter(inputs={"topic": "z"}) as run:
            kinds = [type(e).__name__ async for e in run]
        return kinds, run

    kinds, run = asyncio.run(go())
    assert "InterruptEvent" not in kinds and not run.interrupted
    assert run.result["final"] == "DRAFT ON Z"


# ------------------------------------------------------------------ nested interrupts


def test_an_interrupt_inside_a_nested_graph_pauses_the_outer_run():
    rec = Recorder()
    graph = Graph(E.outer_review(), callbacks=[rec])
    paused = graph.run({"topic": "ai"})
    assert paused.status == "interrupted"
    assert paused.interrupt.name == "approval" and paused.interrupt.value == "approve ai?"
    assert paused.interrupt.response_param == "answer"
    assert "report" not in paused
    outer = [e for e in rec.events if isinstance(e, InterruptEvent) and e.parent_run_id is None]
    assert [e.interrupt_name for e in outer] == ["approval"]
    done = paused.resume({"answer": "yes"})
    assert done.status == "complete" and done["report"] == "AI: YES"
    assert done.run_id == paused.run_id


def test_nested_interrupts_take_handlers_and_up_front_responses():
    graph = Graph(E.outer_review())
    assert graph.run({"topic": "x"}, handlers={"approval": str.upper})["report"] == (
        "X: APPROVE X?")
    assert graph.run({"topic": "x", "answer": "ok"})["report"] == "X: OK"

    @graph.on_interrupt("approval")
    def answer(question: str) -> str:
        return "fine"

    assert graph.run({"topic": "y"})["report"] == "Y: FINE"


def test_nested_interrupt_resumes_from_a_checkpointer():
    graph = Graph(E.outer_review(), checkpointer=MemoryCheckpointer())
    paused = graph.run({"topic": "db"}, session_id="s1")
    assert paused.interrupted
    done = graph.run({"answer": "no"}, session_id="s1", resume=True)
    assert done.status == "complete" and done["report"] == "DB: NO"


def test_nested_interrupts_cannot_map():
    with pytest.raises(TypeError, match=r"review.*approval|approval.*review"):
        Graph(E.outer_review()).map({"topic": ["a"]}, map_over="topic")
    with pytest.raises(TypeError, match=r"InterruptNode.*map_over"):
        E.REVIEW.as_node(name="each", map_over="topic", inputs={"topics": "topic"})


def test_nested_interrupt_in_iter_is_answered_with_respond():
    graph = Graph(E.outer_review())

    async def go():
        async with graph.iter({"topic": "io"}) as run:
            async for _event in run:
                if run.interrupted:
                    assert run.interrupt.name == "approval" and run.interrupt.value == "approve io?"
                    await run.respond({"answer": "ok"})
        return run.result

    result = asyncio.run(go())
    assert result.status == "complete" and result["report"] == "IO: OK"


def test_an_interrupt_two_levels_down_pauses_the_top_run():
    middle = Graph(E.outer_review(), name="middle").as_node(name="middle")
    paused = Graph([middle]).run({"topic": "deep"})
    assert paused.interrupted and paused.interrupt.name == "approval"
    assert paused.resume({"answer": "yes"})["report"] == "DEEP: YES"


def test_dataset_maps_reject_interrupts_too(tmp_path):
    import pyarrow as pa

    with pytest.raises(TypeError, match=r"'approval' inside nested graph 'review'"):
        Graph(E.outer_review()).map(source=pa.table({"topic": ["a"]}), into=tmp_path / "out")
    assert not (tmp_path / "out").exists()
