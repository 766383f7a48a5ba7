"""Human in the loop, driven through ``graph.iter()``: draft -> review -> revise, streamed.

The writer streams its draft token by token; a reviewer (you, with ``--interactive``, or a
scripted reviewer by default) approves it or asks for a revision; every pause is durable in
a SQLite checkpointer, so ``--resume`` in a new process continues the same session.

    python examples/human_review.py                 # scripted reviewer, three rounds
    python examples/human_review.py --interactive   # you review
    python examples/human_review.py --stop          # pause at the first review and exit
    python examples/human_review.py --resume        # ...then continue it later
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypernodes_dist import Graph, InterruptNode, branch, node
from hypernodes_dist.events import InterruptEvent, NodeEndEvent, RunEndEvent, StreamingChunkEvent
from hypernodes_dist.run.checkpointers import SQLiteCheckpointer


@dataclass
class Review:
    choice: str  # "approve" or "revise"
    feedback: str = ""


@node(output_name="draft", tags=["response"])
async def write_draft(topic: str):
    for word in f"A short note on {topic}.".split():
        await asyncio.sleep(0.01)  # a model streaming tokens
        yield word + " "


@node(output_name="review_request")
def ask_review(draft: str) -> str:
    return draft.strip()


review = InterruptNode(name="review", input_param="review_request", response_param="verdict",
                       response_type=Review)


@branch(when_true="publish", when_false="revise")
def approved(verdict: Review) -> bool:
    return verdict.choice == "approve"


@node(output_name="draft", tags=["response"])
async def revise(draft: str, verdict: Review):
    for word in f"{draft.strip()} ({verdict.feedback})".split():
        await asyncio.sleep(0.005)
        yield word + " "


@node(output_name="published")
def publish(draft: str) -> str:
    return draft.strip()


def build(db: Path) -> Graph:
    return Graph([write_draft, ask_review, review, approved, revise, publish],
                 checkpointer=SQLiteCheckpointer(db))


SCRIPT = [Review("revise", "cite sources"), Review("revise", "be concise"), Review("approve")]


def reviewer(interactive: bool, round_no: int, text: str) -> Review:
    if not interactive:
        answer = SCRIPT[min(round_no, len(SCRIPT) - 1)]
        print(f"    reviewer: {answer.choice} {answer.feedback}".rstrip())
        return answer
    feedback = input("    approve? [y / feedback for a revision] ").strip()
    return Review("approve") if feedback.lower() in ("y", "yes", "") else Review("revise", feedback)


async def drive(graph: Graph, args: argparse.Namespace) -> None:
    if args.resume:
        run_ctx = graph.iter(session_id=args.session, resume=True)
    else:
        run_ctx = graph.iter(inputs={"topic": args.topic}, session_id=args.session)
    rounds = 0
    async with run_ctx as run:
        async for event in run:
            if isinstance(event, StreamingChunkEvent) and "response" in event.tags:
                if event.chunk_index == 0:
                    print(f"\n[{event.node_id}] ", end="")
                print(event.chunk, end="", flush=True)
            elif isinstance(event, NodeEndEvent) and event.node_id == "publish":
                print(f"\n[published at step {event.step_index}]")
            elif isinstance(event, InterruptEvent):
                print(f"\n  review #{rounds + 1} requested: {run.interrupt.value!r}")
                if args.stop:
                    ckpt = run.checkpoint()
                    print(f"  stopping; checkpoint {ckpt.checkpoint_id} keeps {sorted(ckpt.state)}")
                    return
                answer = reviewer(args.interactive, rounds, run.interrupt.value)
                rounds += 1
                await run.respond({"verdict": answer})
            elif isinstance(event, RunEndEvent):
                print(f"run {event.run_id} ended: {event.status}")
    if run.result is not None and run.result.status == "complete":
        print("final:", run.result["published"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", default="durable graphs")
    parser.add_argument("--session", default="review-demo")
    parser.add_argument("--db", default=str(Path(tempfile.gettempdir()) / "hn_review.db"))
    parser.add_argument("--interactive", action="store_true")
    parser.add_argument("--stop", action="store_true", help="exit at the first review")
    parser.add_argument("--resume", action="store_true", help="continue the saved session")
    args = parser.parse_args()
    asyncio.run(drive(build(Path(args.db)), args))


if __name__ == "__main__":
    main()
