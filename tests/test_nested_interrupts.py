"""Interrupts inside nested graphs pause the outer run (README: "Semantics the contract
leaves open"); map rejects them."""

from __future__ import annotations

import asyncio

import pytest

from hypernodes_dist import Graph
from hypernodes_dist.events import InterruptEvent
from hypernodes_dist.persistence import MemoryCheckpointer

from .conformance import edge_graphs as E


class Events:
    def __init__(self) -> None:
        self.events: list = []

    def on_event(self, event) -> None:
        self.events.append(event)


# ------------------------------------------------------------------ nested interrupts


def test_an_interrupt_inside_a_nested_graph_pauses_the_outer_run():
    rec = Events()
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
