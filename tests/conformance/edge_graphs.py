"""Graphs of the edge-case conformance tests (module level: worker processes import them)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Literal

from hypernodes_dist import END, Graph, InterruptNode, gate, node

# --------------------------------------------------------------------------- history


@node(output_name="slow")
def slow(x: int) -> int:
    time.sleep(0.002)
    return x * 10


@node(output_name="after")
def after_slow(slow: int) -> int:
    return slow + 1


TIMED = [slow, after_slow]

# --------------------------------------------------------------------------- gates and END


@gate
def only_go(x: int) -> Literal["go"]:
    return END if x == 2 else "go"


@node(output_name="went")
def go(x: int) -> int:
    return x


UNDECLARED_END = [only_go, go]

# a loop whose gate ENDs while another node reads the loop value: both orders of names


@node(output_name="count")
def start(seed: int) -> int:
    return seed


@gate
def check(count: int, limit: int = 3) -> Literal["increment", END]:
    return "increment" if count < limit else END


@node(output_name="count")
def increment(count: int) -> int:
    return count + 1


@gate
def check_bump(count: int, limit: int = 3) -> Literal["bump", END]:
    return "bump" if count < limit else END


@node(output_name="count")
def bump(count: int) -> int:
    return count + 1


@node(output_name="t")
def transform(count: int) -> str:
    return f"t{count}"


LOOP_INCREMENT = [start, check, increment, transform]
LOOP_BUMP = [start, check_bump, bump, transform]

# --------------------------------------------------------------------------- streams


@node(output_name="numbers")
def numbers(k: int):
    yield from range(k)


@node(output_name="text")
def words(k: int) -> str:  # a generator annotated ``str``: a text stream
    for i in range(k):
        yield f"w{i} "


@node(output_name="sizes")
def sizes(numbers: list, text: str) -> tuple:
    return len(numbers), len(text)


STREAMS = [numbers, words, sizes]

# --------------------------------------------------------------------------- duplicates


@node(output_name="sq")
def logged_square(v: int, log_dir: str) -> int:
    Path(log_dir, f"{os.getpid()}-{time.monotonic_ns()}-{v}").touch()
    return v * v


@node(output_name="sq")
async def async_square(v: int, log_dir: str) -> int:
    Path(log_dir, f"{os.getpid()}-{time.monotonic_ns()}-{v}").touch()
    await asyncio.sleep(0.01)  # identical items are in flight together
    return v * v


SQUARE = Graph([logged_square], name="square")
SQUARES = SQUARE.as_node(name="squares", map_over="v", inputs={"vs": "v"},
                         outputs={"sqs": "sq"})


@gate
def unless_negative(v: int) -> Literal["logged_square", END]:
    return END if v < 0 else "logged_square"


GATED_SQUARE = [unless_negative, logged_square]  # a gate that can END: the per-item executor


def calls(log_dir: str) -> list[int]:
    return sorted(int(p.name.rsplit("-", 1)[1]) for p in Path(log_dir).iterdir())


# --------------------------------------------------------------------------- nested interrupt


@node(output_name="question")
def ask_about(topic: str) -> str:
    return f"approve {topic}?"


approval = InterruptNode(name="approval", input_param="question", response_param="answer")


@node(output_name="verdict")
def conclude(answer: str, topic: str) -> str:
    return f"{topic}: {answer}"


REVIEW = Graph([ask_about, approval, conclude], name="review")


@node(output_name="report")
def publish(verdict: str) -> str:
    return verdict.upper()


def outer_review() -> list:
    """A graph whose nested graph asks for approval: ``[review, publish]``."""
    return [REVIEW.as_node(name="review"), publish]
