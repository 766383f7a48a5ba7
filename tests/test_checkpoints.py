"""Checkpoints: persistence backends, resume by session / explicit checkpoint, graph_hash,
minimal state (the seed's four examples), cache refetch, crash resume, new-process resume."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hypernodes_dist import DiskCache, Graph, GraphEngine, InterruptNode, branch, node
from hypernodes_dist.events import NodeEndEvent
from hypernodes_dist.results import NodeExecution
from hypernodes_dist.run.checkpoint import Checkpoint, capture, live_nodes
from hypernodes_dist.run.checkpointers import (
    CheckpointCorruptError,
    Checkpointer,
    FileCheckpointer,
    MemoryCheckpointer,
    SQLiteCheckpointer,
)

from .hitl import ApprovalResponse, make_graph

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["memory", "file", "sqlite"])
def checkpointer(request, tmp_path):
    if request.param == "memory":
        return MemoryCheckpointer()
    if request.param == "file":
        return FileCheckpointer(tmp_path / "ckpts")
    return SQLiteCheckpointer(tmp_path / "app.db")


def _ckpt(cid: str, session: str, state: dict, step: int = 0) -> Checkpoint:
    return Checkpoint(
        checkpoint_id=cid, session_id=session, run_id="run_1",
        history=[NodeExecution("a", 0, outputs={"x": 1})], state=state, step_index=step,
        pending_interrupt=None, graph_hash="h", scheduler={"versions": {"x": 1}},
    )


class Point:  # a user type defined in a test module
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return isinstance(other, Point) and other.x == self.x


# ----------------------------------------------------------------------------- backends
def test_backends_round_trip_and_order(checkpointer):
    assert isinstance(checkpointer, Checkpointer)
    assert checkpointer.load_latest("s") is None and checkpointer.list_checkpoints("s") == []
    assert checkpointer.load_checkpoint("missing") is None

    class Local:
        def __init__(self, v):
            self.v = v

    values = {"p": Point(3), "f": lambda z: z + 1, "local": Local(5), "b": b"\x00", "n": None}
    checkpointer.save_checkpoint(_ckpt("c1", "s/../weird id", values, 1))
    checkpointer.save_checkpoint(_ckpt("c2", "s/../weird id", {"k": [1, 2]}, 2))
    checkpointer.save_checkpoint(_ckpt("c3", "other", {}, 9))
    got = checkpointer.load_checkpoint("c1")
    assert got.state["p"] == Point(3) and got.state["f"](1) == 2 and got.state["local"].v == 5
    assert got.state["b"] == b"\x00" and got.state["n"] is None
    assert got.history[0].outputs == {"x": 1} and got.scheduler == {"versions": {"x": 1}}
    assert [c.checkpoint_id for c in checkpointer.list_checkpoints("s/../weird id")] == ["c1", "c2"]
    assert checkpointer.load_latest("s/../weird id").checkpoint_id == "c2"
    assert checkpointer.load_latest("other").step_index == 9


def _keeping(kind: str, tmp_path: Path, keep: int | None) -> Checkpointer:
    if kind == "memory":
        return MemoryCheckpointer(keep=keep)
    if kind == "file":
        return FileCheckpointer(tmp_path / "ckpts", keep=keep)
    return SQLiteCheckpointer(tmp_path / "app.db", keep=keep)


@pytest.mark.parametrize("kind", ["memory", "file", "sqlite"])
def test_keep_prunes_all_but_the_newest_per_session(kind, tmp_path):
    cp = _keeping(kind, tmp_path, keep=2)
    for i in range(5):
        cp.save_checkpoint(_ckpt(f"a{i}", "A", {"x": i}, step=i))
    cp.save_checkpoint(_ckpt("b0", "B", {"x": 0}))
    cp.save_checkpoint(_ckpt("a4", "A", {"x": 44}, step=4))  # re-saving the newest keeps it
    assert [c.checkpoint_id for c in cp.list_checkpoints("A")] == ["a3", "a4"]
    assert cp.load_latest("A").state == {"x": 44}
    assert cp.load_checkpoint("a0") is None
    assert [c.checkpoint_id for c in cp.list_checkpoints("B")] == ["b0"]


@pytest.mark.parametrize("kind", ["memory", "file", "sqlite"])
def test_keep_one_still_resumes_a_conversation(kind, tmp_path):
    cp = _keeping(kind, tmp_path, keep=1)
    g = make_graph(checkpointer=cp)
    assert g.run({"topic": "T"}, session_id="s").interrupted
    r = g.run(session_id="s", resume=True, inputs={"user_decision": ApprovalResponse("approve")})
    assert r.status == "complete" and r["final"] == "DRAFT ON T"
    assert len(cp.list_checkpoints("s")) == 1


@pytest.mark.parametrize("keep", [0, -1, 1.5, True, "2"])
def test_keep_must_be_a_positive_integer(keep, tmp_path):
    for kind in ("memory", "file", "sqlite"):
        with pytest.raises(ValueError, match="keep must be"):
            _keeping(kind, tmp_path, keep=keep)


def test_saved_checkpoint_is_a_copy():
    cp = MemoryCheckpointer()
    state = {"xs": [1]}
    cp.save_checkpoint(_ckpt("c", "s", state))
    state["xs"].append(2)
    assert cp.load_checkpoint("c").state == {"xs": [1]}


def test_file_metadata_is_json_and_corruption_is_detected(tmp_path):
    fc = FileCheckpointer(tmp_path)
    fc.save_checkpoint(_ckpt("c1", "sess", {"a": 1}))
    (path,) = list(tmp_path.glob("*/*.json"))
    meta = json.loads(path.read_text())
    assert meta["checkpoint_id"] == "c1" and meta["session_id"] == "sess" and "sha256" in meta
    meta["payload"] = meta["payload"][:-8] + "AAAAAAA="
    path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointCorruptError):
        fc.load_checkpoint("c1")


def test_sqlite_corruption_is_detected(tmp_path):
    sc = SQLiteCheckpointer(tmp_path / "db.sqlite")
    sc.save_checkpoint(_ckpt("c1", "sess", {"a": 1}))
    db = sqlite3.connect(tmp_path / "db.sqlite")
    with db:
        db.execute("UPDATE checkpoints SET payload = ?", (b"garbage",))
    db.close()
    with pytest.raises(CheckpointCorruptError):
        sc.load_latest("sess")


# ----------------------------------------------------------------------------- resume
def test_resume_by_session_id_continues_the_same_run(checkpointer):
    g = make_graph(checkpointer=checkpointer)
    r = g.run({"topic": "T"}, session_id="conv-1")
    assert r.interrupted
    latest = checkpointer.load_latest("conv-1")
    assert latest.status == "interrupted" and latest.checkpoint_id == r.checkpoint.checkpoint_id
    r2 = g.run(session_id="conv-1", resume=True,
               inputs={"user_decision": ApprovalResponse("revise", "more")})
    assert r2.interrupted and r2.run_id == r.run_id
    r3 = g.run(session_id="conv-1", resume=True,
               inputs={"user_decision": ApprovalResponse("approve")})
    assert r3.status == "complete" and r3.run_id == r.run_id
    assert r3["final"] == "DRAFT ON T [MORE]"
    steps = [h.step_index for h in r3.history]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert [h.node_id for h in r3.history].count("generate_draft") == 1
    # the session's last run completed: resume=True now starts a fresh run
    r4 = g.run(session_id="conv-1", resume=True, inputs={"topic": "U"})
    assert r4.interrupted and r4.run_id != r.run_id


def test_resume_true_without_checkpoint_starts_fresh():
    g = make_graph(checkpointer=MemoryCheckpointer())
    r = g.run({"topic": "t"}, session_id="new", resume=True)
    assert r.interrupted and r.session_id == "new"
    with pytest.raises(ValueError, match="checkpointer"):
        make_graph().run({"topic": "t"}, session_id="x", resume=True)


def test_explicit_checkpoint_wins_and_graph_change_is_rejected():
    g = make_graph()
    r = g.run({"topic": "t"})
    assert g.run({"user_decision": ApprovalResponse("approve")},
                 checkpoint=r.checkpoint)["final"] == "DRAFT ON T"

    @node(output_name="extra")
    def extra(final: str) -> str:
        return final

    from .hitl import NODES

    changed = Graph([*NODES, extra])
    with pytest.raises(ValueError, match="graph changed"):
        changed.run({"user_decision": ApprovalResponse("approve")}, checkpoint=r.checkpoint)


def test_checkpoints_at_step_boundaries_and_crash_resume():
    cp = MemoryCheckpointer()
    calls: list[str] = []
    fail = {"on": True}

    @node(output_name="b")
    def step_a(a: int) -> int:
        calls.append("a")
        return a + 1

    @node(output_name="c")
    def step_b(b: int) -> int:
        calls.append("b")
        if fail["on"]:
            raise ConnectionError("flaky")
        return b * 10

    @node(output_name="d")
    def step_c(c: int) -> int:
        calls.append("c")
        return c + 1

    g = Graph([step_a, step_b, step_c], checkpointer=cp)
    with pytest.raises(ConnectionError):
        g.run({"a": 1}, session_id="job")
    saved = cp.list_checkpoints("job")
    assert [c.status for c in saved] == ["running", "error"]
    assert saved[-1].state == {"b": 2} and saved[-1].scheduler["counts"] == {"step_a": 1}
    fail["on"] = False
    r = g.run(session_id="job", resume=True)
    assert r["d"] == 21 and calls == ["a", "b", "b", "c"]
    assert r.run_id == saved[0].run_id
    assert [c.status for c in cp.list_checkpoints("job")][-1] == "complete"


def test_interrupted_run_resumed_in_a_new_process_from_sqlite(tmp_path):
    script = tmp_path / "flow.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from hypernodes_dist import Graph, InterruptNode, branch, node
        from hypernodes_dist.persistence import SQLiteCheckpointer

        LOG = {str(tmp_path / "calls.log")!r}

        def log(name):
            with open(LOG, "a") as f:
                f.write(name + "\\n")

        @node(output_name="draft")
        def write(topic: str) -> str:
            log("write")
            return "draft:" + topic

        review = InterruptNode(name="review", input_param="draft", response_param="verdict")

        @node(output_name="final")
        def publish(draft: str, verdict: str) -> str:
            log("publish")
            return draft + "/" + verdict

        graph = Graph([write, review, publish],
                      checkpointer=SQLiteCheckpointer({str(tmp_path / "app.db")!r}))
        if sys.argv[1] == "start":
            r = graph.run({{"topic": "ai"}}, session_id="order-1")
            print(r.status, r.run_id, r.interrupt.value)
        else:
            r = graph.run(session_id="order-1", resume=True, inputs={{"verdict": "ok"}})
            print(r.status, r.run_id, r["final"])
    """))
    first = subprocess.run([sys.executable, str(script), "start"], capture_output=True,
                           text=True, check=True).stdout.split()
    second = subprocess.run([sys.executable, str(script), "resume"], capture_output=True,
                            text=True, check=True).stdout.split()
    assert first[0] == "interrupted" and first[2] == "draft:ai"
    assert second == ["complete", first[1], "draft:ai/ok"]
    assert (tmp_path / "calls.log").read_text().split() == ["write", "publish"]


# ----------------------------------------------------------------------------- minimal state
def _pause(graph: Graph, inputs: dict) -> Checkpoint:
    r = graph.run(inputs)
    assert r.interrupted, r
    return r.checkpoint


def _rag_nodes():
    @node(output_name="corpus")
    def load_corpus(source: str) -> str:
        return "TEXT " * 1000

    @node(output_name="embeddings")
    def embed_all_docs(corpus: str) -> list:
        return [float(i) for i in range(5000)]

    @node(output_name="index")
    def build_index(embeddings: list) -> dict:
        return {"n": len(embeddings)}

    @node(output_name="index_summary")
    def summarize_index(index: dict) -> str:
        return f"{index['n']} vectors"

    ask = InterruptNode(name="ask", input_param="index_summary", response_param="question")

    @node(output_name="answer")
    def query(index: dict, question: str) -> str:
        return f"{question}: {index['n']}"

    return [load_corpus, embed_all_docs, build_index, summarize_index, ask, query]


def test_example_1_large_intermediates_are_not_saved():
    ckpt = _pause(Graph(_rag_nodes()), {"source": "s3://corpus"})
    assert set(ckpt.state) == {"index", "index_summary"}
    saved_outputs = {k for h in ckpt.history for k in h.outputs}
    assert "embeddings" not in saved_outputs and "corpus" not in saved_outputs
    r = Graph(_rag_nodes()).run({"question": "how many"}, checkpoint=ckpt)
    assert r["answer"] == "how many: 5000"
    assert "embeddings" not in r  # no cache: a dropped intermediate is gone


def test_example_1_dropped_outputs_come_back_from_the_cache(tmp_path):
    cache = DiskCache(str(tmp_path / "cache"))
    ckpt = _pause(Graph(_rag_nodes(), cache=cache), {"source": "s3://corpus"})
    assert "embeddings" not in ckpt.state
    r = Graph(_rag_nodes(), cache=cache).run({"question": "q"}, checkpoint=ckpt)
    assert r["answer"] == "q: 5000" and len(r["embeddings"]) == 5000
    assert r["corpus"].startswith("TEXT")
    r2 = Graph(_rag_nodes(), cache=cache).run({"question": "q"}, checkpoint=ckpt,
                                              select=["answer"])
    assert set(r2) == {"answer"}


def test_example_2_the_branch_not_taken_keeps_nothing():
    @node(output_name="document")
    def fetch_doc(url: str) -> str:
        return "doc@" + url

    @branch(when_true="summarize_a", when_false="prepare_b")
    def route(document: str) -> bool:
        return False

    @node(output_name="summary_a")
    def summarize_a(document: str, style_a: str) -> str:
        return style_a + document

    @node(output_name="b_prompt")
    def prepare_b(document: str) -> str:
        return "check " + document

    review_b = InterruptNode(name="review_b", input_param="b_prompt", response_param="b_notes")

    @node(output_name="summary_b")
    def summarize_b(document: str, b_notes: str) -> str:
        return document + "+" + b_notes

    g = Graph([fetch_doc, route, summarize_a, prepare_b, review_b, summarize_b])
    ckpt = _pause(g, {"url": "u", "style_a": "A" * 10_000})
    assert set(ckpt.state) == {"document", "b_prompt"}
    assert g.run({"b_notes": "fine"}, checkpoint=ckpt)["summary_b"] == "doc@u+fine"


def _cycle_graph():
    @node(output_name="messages")
    def init(topic: str) -> list:
        return [f"write about {topic}"]

    @node(output_name="draft")
    def generate(messages: list) -> str:
        return f"draft v{len(messages)}"

    @node(output_name="review_prompt")
    def evaluate(draft: str) -> str:
        return f"score {draft}"

    human = InterruptNode(name="human", input_param="review_prompt", response_param="score")

    @branch(when_true="final", when_false="revise")
    def good_enough(score: int) -> bool:
        return score >= 8

    @node(output_name=("draft", "messages"))
    def revise(draft: str, score: int, messages: list):
        return f"{draft}+", [*messages, f"score was {score}"]

    @node(output_name="published")
    def final(draft: str) -> str:
        return draft

    return Graph([init, generate, evaluate, human, good_enough, revise, final])


def test_example_3_cycles_keep_only_the_latest_values():
    g = _cycle_graph()
    r = g.run({"topic": "t"})
    for score in (3, 4, 5, 6):
        r = r.resume({"score": score})
        assert r.interrupted
    ckpt = r.checkpoint
    assert set(ckpt.state) == {"messages", "draft", "review_prompt", "score"}
    # revise rewrites messages, so generate runs again on each of the 4 rounds
    assert ckpt.state["draft"] == "draft v5" and len(ckpt.state["messages"]) == 5
    kept_drafts = [h.outputs["draft"] for h in ckpt.history if "draft" in h.outputs]
    assert kept_drafts == ["draft v5"]  # previous drafts are not saved
    assert [h.node_id for h in ckpt.history].count("revise") == 4  # the record stays
    assert r.resume({"score": 9})["published"] == "draft v5"


def _fan_out_nodes(block: dict):
    @node(output_name=("part_1", "part_2"))
    def split(data: str):
        return data[:3], data[3:]

    @node(output_name="analysis_1")
    async def analyze_1(part_1: str) -> str:
        return part_1.upper()

    @node(output_name="analysis_2")
    async def analyze_2(part_2: str) -> str:
        while block["on"]:
            await asyncio.sleep(0.01)
        block["ran"] = block.get("ran", 0) + 1
        return part_2.upper()

    @node(output_name="merged_result")
    def merge(analysis_1: str, analysis_2: str) -> str:
        return analysis_1 + analysis_2

    approve = InterruptNode(name="approve", input_param="merged_result",
                            response_param="approved")

    @node(output_name="report")
    def publish(merged_result: str, approved: bool) -> str:
        return merged_result if approved else ""

    return [split, analyze_1, analyze_2, merge, approve, publish]


def test_example_4_fan_out_saved_at_the_join():
    g = Graph(_fan_out_nodes({"on": False}), engine=GraphEngine(parallel_nodes=True))
    ckpt = _pause(g, {"data": "abcdef"})
    assert set(ckpt.state) == {"merged_result"}
    assert g.run({"approved": True}, checkpoint=ckpt)["report"] == "ABCDEF"


def test_example_4_mid_parallel_keeps_completed_outputs_and_reruns_the_rest():
    block = {"on": True}
    g = Graph(_fan_out_nodes(block), engine=GraphEngine(parallel_nodes=True))

    async def go():
        async with g.iter(inputs={"data": "abcdef"}) as run:
            async for e in run:
                if isinstance(e, NodeEndEvent) and e.node_id == "analyze_1":
                    await asyncio.sleep(0.02)  # analyze_2 is still in flight
                    return run.checkpoint()

    ckpt = asyncio.run(go())
    assert set(ckpt.state) == {"analysis_1", "part_2"}
    assert live_nodes(g.plan, _restored(ckpt)) == {"analyze_2", "merge", "approve", "publish"}
    block["on"] = False
    r = g.run({"approved": True}, checkpoint=ckpt)
    assert r["report"] == "ABCDEF" and block["ran"] == 1
    assert [h.node_id for h in r.history].count("analyze_1") == 1


def _restored(ckpt):
    from hypernodes_dist.run.checkpoint import restore

    return restore(ckpt)


def test_capture_without_plan_keeps_everything():
    g = Graph(_rag_nodes())
    r = g.run({"source": "x"})
    from hypernodes_dist.run.checkpoint import restore

    full = capture(restore(r.checkpoint), session_id="s", run_id="r", graph_hash=g.graph_hash)
    assert set(full.state) == set(r.checkpoint.state)
