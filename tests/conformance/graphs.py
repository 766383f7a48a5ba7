"""Graphs of the conformance suite, at module level so worker processes can import them."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hypernodes_dist import END, InterruptNode, branch, gate, node

# --------------------------------------------------------------------------- trivial chain


@node(output_name="a")
def inc(x: int) -> int:
    return x + 1


@node(output_name="b")
def double(a: int) -> int:
    return a * 2


@node(output_name="c")
def fmt(b: int, y: str = "y") -> str:
    return f"{b}-{y}"


CHAIN = [inc, double, fmt]


def chain_expected(x: int, y: str = "y") -> dict:
    return {"a": x + 1, "b": (x + 1) * 2, "c": f"{(x + 1) * 2}-{y}"}


# --------------------------------------------------------------------------- multi-output


@node(output_name=("mean", "std"))
def statistics(data: list) -> tuple:
    mean = sum(data) / len(data)
    var = sum((d - mean) ** 2 for d in data) / len(data)
    return mean, var**0.5


@node(output_name="summary")
def summarize(mean: float, std: float, precision: int = 2) -> str:
    return f"{round(mean, precision)}±{round(std, precision)}"


STATS = [statistics, summarize]


# --------------------------------------------------------------------------- branch


@branch(when_true="process_valid", when_false="handle_error")
def is_valid(data: dict) -> bool:
    return data.get("valid", False)


@node(output_name="result")
def process_valid(data: dict) -> str:
    return f"ok:{data['v']}"


@node(output_name="result")
def handle_error(data: dict) -> str:
    return f"bad:{data['v']}"


@node(output_name="report")
def report(result: str, suffix: str = "!") -> str:
    return result + suffix


BRANCH = [is_valid, process_valid, handle_error, report]


# --------------------------------------------------------------------------- gate + END


@node(output_name="state")
def init_state(query: str) -> dict:
    return {"query": query, "notes": 0}


@gate
def decide(state: dict) -> Literal["research", ("respond", "Answer now"), END]:
    if state["query"] == "stop":
        return END
    return "respond" if state["notes"] >= 2 else "research"


@node(output_name="state")
def research(state: dict) -> dict:
    return {**state, "notes": state["notes"] + 1}


@node(output_name="answer")
def respond(state: dict) -> str:
    return f"{state['query']}:{state['notes']}"


GATE = [init_state, decide, research, respond]


# --------------------------------------------------------------------------- cycle (draft/revise)


@node(output_name="draft")
def generate_draft(topic: str) -> str:
    return f"{topic} v0"


@node(output_name="score")
def evaluate(draft: str) -> int:
    return len(draft)


@branch(when_true="finalize", when_false="revise")
def good_enough(score: int, target: int = 10) -> bool:
    return score >= target


@node(output_name="final")
def finalize(draft: str) -> str:
    return draft.upper()


@node(output_name="draft")
def revise(draft: str) -> str:
    return draft + "+"


CYCLE = [generate_draft, evaluate, good_enough, finalize, revise]


def cycle_expected(topic: str, target: int = 10) -> str:
    draft = f"{topic} v0"
    while len(draft) < target:
        draft += "+"
    return draft.upper()


# --------------------------------------------------------------------------- async + streaming


@node(output_name="fetched")
async def fetch(x: int) -> int:
    await asyncio.sleep(0.001)
    return x * 10


@node(output_name="total")
async def add_async(fetched: int, a: int) -> int:
    await asyncio.sleep(0)
    return fetched + a


ASYNC = [inc, fetch, add_async]


@node(output_name="words")
def tokens(text: str):
    for word in text.split():
        yield len(word)


@node(output_name="shout")
async def shout(text: str):
    for part in text.split():
        await asyncio.sleep(0)
        yield part.upper() + " "


STREAMING = [tokens, shout]


# --------------------------------------------------------------------------- failures


class ItemFailure(ValueError):
    """Raised by ``fragile`` for chosen items."""


@node(output_name="safe")
def fragile(x: int, bad: tuple = (3,)) -> int:
    if x in bad:
        raise ItemFailure(f"bad item {x}")
    return x * 100


@node(output_name="after")
def after(safe: int) -> int:
    return safe + 1


FRAGILE = [fragile, after]


@node(output_name=("p", "q"))
def wrong_shape(x: int):
    return (x, x, x) if x == 2 else (x, -x)


# --------------------------------------------------------------------------- objects & interrupts


@dataclass(frozen=True)
class Product:
    sku: str
    price: float


@node(output_name="label")
def label(product: Product, currency: str = "EUR") -> str:
    return f"{product.sku}@{product.price:.2f}{currency}"


@node(output_name="nothing")
def returns_none(x: int) -> None:
    return None


approval = InterruptNode(name="approval", input_param="prompt", response_param="decision")


@node(output_name="prompt")
def make_prompt(x: int) -> str:
    return f"approve {x}?"


@node(output_name="done")
def use_decision(decision: str) -> str:
    return decision


INTERRUPT = [make_prompt, approval, use_decision]


# --------------------------------------------------------------------------- execution counting


@node(output_name="counted")
def counted(x: int, log_dir: str) -> int:
    """Appends one line per execution to a file, so tests count executions across processes."""
    with open(Path(log_dir) / f"{os.getpid()}.log", "a") as fh:
        fh.write(f"{x}\n")
    return x * 3


@node(output_name="counted_plus")
def counted_plus(counted: int) -> int:
    return counted + 1


@node(output_name="never_cached", cache=False)
def never_cached(counted_plus: int, log_dir: str) -> int:
    with open(Path(log_dir) / f"nc-{os.getpid()}.log", "a") as fh:
        fh.write(f"{counted_plus}\n")
    return -counted_plus


COUNTED = [counted, counted_plus]


def executions(directory: Path, prefix: str = "") -> list[int]:
    lines: list[int] = []
    for f in Path(directory).glob(f"{prefix}[0-9]*.log"):
        lines.extend(int(s) for s in f.read_text().split())
    return sorted(lines)


@node(output_name="k")
def constant() -> int:
    return 7


@node(output_name="ak")
async def async_constant() -> int:
    return 8


@node(output_name="total_k")
def add_constants(x: int, k: int, ak: int) -> int:
    return x + k + ak


CONSTANTS = [constant, async_constant, add_constants]


# --------------------------------------------------------------------------- routing without END


@branch(when_true="enrich", when_false="plain")
def rich(x: int) -> bool:
    return x > 0


@node(output_name="extra")
def enrich(x: int) -> str:
    return f"E{x}"


@node(output_name="base")
def plain(x: int) -> str:
    return f"P{x}"


@node(output_name="combined")
def combine(x: int, extra: str = "none") -> str:
    return f"{x}:{extra}"


@node(output_name="strict")
def needs_extra(extra: str) -> str:
    return extra.lower()


DEFAULTS = [rich, enrich, plain, combine, needs_extra]


@gate
def route(kind: str) -> Literal["to_upper", "to_lower", ("to_len", "Measure it")]:
    return {"u": "to_upper", "l": "to_lower"}.get(kind[:1], "to_len")


@node(output_name="styled")
def to_upper(text: str) -> str:
    return text.upper()


@node(output_name="styled")
def to_lower(text: str) -> str:
    return text.lower()


@node(output_name="styled")
def to_len(text: str) -> str:
    return str(len(text))


@node(output_name="final_text")
def finish(styled: str, text: str) -> str:
    return f"{text}->{styled}"


ROUTE = [route, to_upper, to_lower, to_len, finish]


@node(output_name="noisy", cache=False)
def noisy(x: int) -> int:
    return x * 7


@node(output_name="mixed")
def mixed(noisy: int, a: int) -> int:
    return noisy + a


MIXED = [inc, noisy, mixed]


# --------------------------------------------------------------------------- acyclic END gates


@node(output_name="score")
def score_of(x: int) -> int:
    return x % 4


@gate
def triage(score: int) -> Literal["deepen", END]:
    return END if score == 0 else "deepen"


@node(output_name="detail")
def deepen(x: int, score: int) -> str:
    return f"d{x}/{score}"


@node(output_name="summary")
def summarize(x: int, detail: str = "none") -> str:  # a default: would run if END let it
    return f"{x}:{detail}"


END_CHAIN = [score_of, triage, deepen, summarize]  # every node before or after the gate


@node(output_name="side")
def side(x: int) -> int:  # unrelated to the gate: such graphs take the per-item path
    return -x


END_BESIDE = [*END_CHAIN, side]
