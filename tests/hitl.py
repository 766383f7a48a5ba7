"""Shared test graph: the seed's draft / review / revise loop."""

from __future__ import annotations

from dataclasses import dataclass

from hypernodes_dist import Graph, InterruptNode, branch, node


@dataclass
class ApprovalPrompt:
    message: str
    draft: str


@dataclass
class ApprovalResponse:
    choice: str
    feedback: str | None = None


CALLS: list[str] = []


@node(output_name="draft")
def generate_draft(topic: str) -> str:
    CALLS.append("generate_draft")
    return f"draft on {topic}"


@node(output_name="approval_prompt")
def create_prompt(draft: str) -> ApprovalPrompt:
    CALLS.append("create_prompt")
    return ApprovalPrompt(message="Approve?", draft=draft)


approval = InterruptNode(
    name="approval",
    input_param="approval_prompt",
    response_param="user_decision",
    response_type=ApprovalResponse,
)


@branch(when_true="finalize", when_false="revise")
def check_approval(user_decision: ApprovalResponse) -> bool:
    return user_decision.choice == "approve"


@node(output_name="final")
def finalize(draft: str) -> str:
    CALLS.append("finalize")
    return draft.upper()


@node(output_name="draft")
def revise(draft: str, user_decision: ApprovalResponse) -> str:
    CALLS.append("revise")
    return f"{draft} [{user_decision.feedback}]"


NODES = [generate_draft, create_prompt, approval, check_approval, finalize, revise]


def make_graph(**kwargs) -> Graph:
    return Graph(NODES, **kwargs)
