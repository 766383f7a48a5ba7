"""The reference semantics of run(): the seed's examples and the execution rules."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from hypernodes_dist import END, Graph, GraphEngine, InterruptNode, branch, gate, node
from hypernodes_dist.errors import GateDecisionError, MaxIterationsError, UnknownTargetError

from .conformance import edge_graphs as E

# ------------------------------------------------------------------ seed examples


def test_linear_rag_chain():
    @node(output_name="embedding")
    def embed(text: str) -> list:
        return [float(len(text))]

    @node(output_name="docs")
    def retrieve(embedding: list) -> list:
        return [f"doc-{int(embedding[0])}"]

    @node(output_name="answer")
    def generate(query: str, docs: list, llm: str = "echo") -> str:
        return f"{llm}: {query} | {docs[0]}"

    g = Graph([embed, retrieve, generate])
    r = g.run({"text": "What is RAG?", "query": "What is RAG?"})
    assert r["answer"] == "echo: What is RAG? | doc-12"
    assert r.session_id.startswith("sess_") and r.run_id.startswith("run_")
    assert [h.node_id for h in r.history] == ["embed", "retrieve", "generate"]
    assert [h.step_index for h in r.history] == [0, 1, 2]


def test_multi_output_statistics():
    @node(output_name=("mean", "std"))
    def statistics(data: list) -> tuple:
        m = sum(data) / len(data)
        return m, (sum((d - m) ** 2 for d in data) / len(data)) ** 0.5

    r = Graph([statistics]).run({"data": [2.0, 4.0]})
    assert (r["mean"], r["std"]) == (3.0, 1.0)


def test_is_valid_branch_and_skip():
    @branch(when_true="process_valid", when_false="handle_error")
    def is_valid(data: dict) -> bool:
        return data.get("valid", False)

    @node(output_name="result")
    def process_valid(data: dict) -> str:
        return "processed"

    @node(output_name="result")
    def handle_error(data: dict) -> str:
        return "error handled"

    g = Graph([is_valid, process_valid, handle_error])
    assert g.run({"data": {"valid": True}})["result"] == "processed"
    r = g.run({"data": {}})
    assert r["result"] == "error handled"
    assert [h.node_id for h in r.history] == ["is_valid", "handle_error"]


def test_decide_gate_with_end():
    AgentAction = Literal["research", ("respond", "Generate final answer"), END]

    @gate
    def decide(state: dict) -> AgentAction:
        if state.get("stop"):
            return END
        return "respond" if state.get("ready") else "research"

    @node(output_name="state")
    def research(query: str) -> dict:
        return {"ready": True}

    @node(output_name="answer")
    def respond(query: str) -> str:
        return f"answer to {query}"

    @node(output_name="state")
    def init(query: str) -> dict:
        return {"stop": query == "quit"}

    g = Graph([decide, research, respond, init])
    r = g.run({"query": "q"})
    assert r["answer"] == "answer to q"
    assert [h.node_id for h in r.history] == ["init", "decide", "research", "decide", "respond"]
    r = g.run({"query": "quit"})
    assert r.status == "complete" and "answer" not in r
    assert [h.node_id for h in r.history] == ["init", "decide"]


def test_draft_revise_cycle_with_interrupt_handler():
    @node(output_name="draft")
    def generate_draft(topic: str) -> str:
        return f"draft about {topic}"

    @node(output_name="approval_prompt")
    def create_prompt(draft: str) -> str:
        return f"Approve? {draft}"

    approval = InterruptNode(name="approval", input_param="approval_prompt",
                             response_param="user_decision")

    @branch(when_true="finalize", when_false="revise")
    def check_approval(user_decision: str) -> bool:
        return user_decision == "approve"

    @node(output_name="final")
    def finalize(draft: str) -> str:
        return draft.upper()

    @node(output_name="draft")
    def revise(draft: str, user_decision: str) -> str:
        return draft + " (revised)"

    g = Graph([generate_draft, create_prompt, approval, check_approval, finalize, revise])
    prompts: list[str] = []

    def reviewer(prompt: str) -> str:
        prompts.append(prompt)
        return "approve" if prompt.count("revised") >= 2 else "reject"

    r = g.run({"topic": "AI"}, handlers={"approval": reviewer})
    assert r["final"] == "DRAFT ABOUT AI (REVISED) (REVISED)"
    assert len(prompts) == 3
    assert [h.node_id for h in r.history].count("revise") == 2


def test_interrupt_without_handler_then_resume():
    @node(output_name="prompt")
    def ask(x: int) -> str:
        return f"ok {x}?"

    gate_i = InterruptNode(name="confirm", input_param="prompt", response_param="answer")

    @node(output_name="out")
    def use(answer: str, x: int) -> str:
        return f"{answer}-{x}"

    g = Graph([ask, gate_i, use])
    r = g.run({"x": 1})
    assert r.status == "interrupted" and r.interrupted
    assert (r.interrupt.name, r.interrupt.value) == ("confirm", "ok 1?")
    done = r.resume({"answer": "yes"})
    assert done["out"] == "yes-1" and done.run_id == r.run_id
    assert [h.node_id for h in done.history] == ["ask", "confirm", "use"]


def test_async_handler_and_async_nodes():
    @node(output_name="prompt")
    async def ask(x: int) -> str:
        await asyncio.sleep(0)
        return "p"

    i = InterruptNode(name="confirm", input_param="prompt", response_param="answer")

    @node(output_name="out")
    async def use(answer: str) -> str:
        return answer * 2

    g = Graph([ask, i, use])

    @g.on_interrupt("confirm")
    async def handle(prompt: str) -> str:
        await asyncio.sleep(0)
        return prompt + "!"

    assert g.run({"x": 1})["out"] == "p!p!"
    assert asyncio.run(g.arun({"x": 1}))["out"] == "p!p!"


# ------------------------------------------------------------------ rules


def test_default_used_when_producer_never_runs():
    @branch(when_true="enrich", when_false="plain")
    def rich(x: int) -> bool:
        return x > 0

    @node(output_name="extra")
    def enrich(x: int) -> str:
        return "E"

    @node(output_name="base")
    def plain(x: int) -> str:
        return "P"

    @node(output_name="out")
    def combine(x: int, extra: str = "none") -> str:
        return f"{x}:{extra}"

    @node(output_name="strict")
    def needs_extra(extra: str) -> str:
        return extra

    g = Graph([rich, enrich, plain, combine, needs_extra])
    assert g.required_inputs == ("x",)
    assert g.run({"x": 1})["out"] == "1:E"
    r = g.run({"x": -1})
    assert r["out"] == "-1:none" and "strict" not in r


def test_produced_name_is_not_an_input():
    @node(output_name="b")
    def f(a: int) -> int:
        return a

    @node(output_name="c")
    def h(b: int) -> int:
        return b

    g = Graph([f, h])
    assert g.inputs == ("a",)
    with pytest.raises(ValueError, match="'b' is produced by f"):
        g.run({"a": 1, "b": 2})


def test_missing_and_unknown_inputs():
    @node(output_name="c")
    def f(a: int, b: int, d: int = 0) -> int:
        return a + b + d

    g = Graph([f])
    with pytest.raises(ValueError, match="'a', 'b'"):
        g.run({})
    with pytest.raises(ValueError, match="unknown input.*'zz'"):
        g.run({"a": 1, "b": 2, "zz": 3})


def test_rerun_on_rewrite_even_when_equal():
    calls = []

    @node(output_name="v")
    def start(seed: int) -> int:
        return seed

    @node(output_name="seen")
    def observe(v: int) -> int:
        calls.append(v)
        return v

    @branch(when_true="again", when_false="finish")
    def more(seen: int, rounds: int = 3) -> bool:
        return len(calls) < rounds

    @node(output_name="v")
    def again(v: int) -> int:
        return v  # writes an equal value: still a new write

    @node(output_name="end")
    def finish(seen: int) -> int:
        return seen

    r = Graph([start, observe, more, again, finish]).run({"seed": 7})
    assert calls == [7, 7, 7] and r["end"] == 7


def test_max_iterations_names_the_loop():
    @node(output_name="n")
    def start(x: int) -> int:
        return x

    @branch(when_true="step", when_false="done")
    def forever(n: int) -> bool:
        return True

    @node(output_name="n")
    def step(n: int) -> int:
        return n + 1

    @node(output_name="out")
    def done(n: int) -> int:
        return n

    g = Graph([start, forever, step, done], max_iterations=50)
    with pytest.raises(MaxIterationsError) as info:
        g.run({"x": 0})
    assert "forever" in str(info.value) and "step" in str(info.value)


def test_gate_returning_unknown_target_is_an_error():
    @gate
    def route(x: int) -> Literal["a", END]:
        return "b"

    @node(output_name="y")
    def a(x: int) -> int:
        return x

    with pytest.raises(GateDecisionError, match="'b'"):
        Graph([route, a]).run({"x": 1})


def test_branch_must_return_bool():
    @branch(when_true="a", when_false="b")
    def check(x: int):
        return "yes"

    @node(output_name="y")
    def a(x: int) -> int:
        return 1

    @node(output_name="y")
    def b(x: int) -> int:
        return 2

    with pytest.raises(GateDecisionError, match="bool"):
        Graph([check, a, b]).run({"x": 1})


def test_run_inside_running_event_loop():
    @node(output_name="y")
    async def f(x: int) -> int:
        return x + 1

    async def main() -> int:
        return Graph([f]).run({"x": 1})["y"]

    assert asyncio.run(main()) == 2


def test_select_on_run_and_unknown_select():
    @node(output_name="b")
    def f(a: int) -> int:
        return a + 1

    g = Graph([f])
    assert dict(g.run({"a": 1}, select=["b"])) == {"b": 2}
    with pytest.raises(ValueError, match="'zz'"):
        g.run({"a": 1}, select=["zz"])


# ------------------------------------------------------------------ gates and END, loops that END (from the edge cases)


def test_undeclared_end_raises_naming_the_gate_and_its_targets():
    with pytest.raises(GateDecisionError, match=r"gate 'only_go' returned END.*'go'.*Literal"):
        Graph(E.UNDECLARED_END).run({"x": 2})
    assert Graph(E.UNDECLARED_END).run({"x": 1})["went"] == 1


def test_the_string_END_in_a_literal_points_to_the_END_constant():
    @gate
    def decide(x: int) -> Literal["go", "END"]:
        return "go"

    with pytest.raises(UnknownTargetError, match=r"'END'.*END constant.*from hypernodes_dist import END"):
        Graph([decide, E.go])


@pytest.mark.parametrize("nodes", [E.LOOP_INCREMENT, E.LOOP_BUMP], ids=["increment", "bump"])
@pytest.mark.parametrize("parallel", [False, True])
def test_loop_outputs_are_consistent_when_the_gate_ends(nodes, parallel):
    res = Graph(nodes, engine=GraphEngine(parallel_nodes=parallel)).run({"seed": 0})
    assert res["count"] == 3 and res["t"] == "t3"
    order = [h.node_id for h in res.history]
    assert order[-1] in ("check", "check_bump")  # the gate decides last, on settled values
    assert order.count("transform") == 4  # on every value of count: 0, 1, 2, 3
