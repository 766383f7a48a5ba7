"""Batch nodes of the conformance suite (module level: worker processes import them).

Every call appends one JSON line to ``<log_dir>/<tag>.calls``: the texts it received (in
order) and its pid. Worker processes share no memory with the driver, so the tests read
the calls back from these files. ``log_dir`` is an input like any other: a batch node
receives it as a list (one entry per item), hence ``log_dir[0]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from hypernodes_dist import Graph, node, resource

from .policy_graphs import _append

B = 4  # batch_size of every batch node here


def record(log_dir: list[str], tag: str, texts: list[str]) -> None:
    assert len(set(log_dir)) == 1, "a broadcast input is the same in every slot"
    _append(Path(log_dir[0]) / f"{tag}.calls", json.dumps({"texts": texts, "pid": os.getpid()}))


def calls(log_dir: str, tag: str) -> list[list[str]]:
    """The texts of each call of ``tag`` so far, in the order they were recorded."""
    path = Path(log_dir) / f"{tag}.calls"
    if not path.exists():
        return []
    return [json.loads(line)["texts"] for line in path.read_text().splitlines()]


def measure(texts: list[str]) -> list[object]:
    """One value per text; ``"bad..."`` texts get a ``ValueError`` in their slot."""
    return [ValueError(f"bad text {t!r}") if t.startswith("bad") else len(t) for t in texts]


# --------------------------------------------------------------------------- plain batch nodes


@node(output_name="size", batch_size=B)
def b_size(text: list[str], log_dir: list[str]) -> list[object]:
    record(log_dir, "size", text)
    return measure(text)


@node(output_name="size", batch_size=B)
async def ab_size(text: list[str], log_dir: list[str]) -> list[object]:
    record(log_dir, "size", text)
    await asyncio.sleep(0.002)
    return measure(text)


@node(output_name="text")
def clean(raw: str) -> str:
    """A per-item node before the batch node."""
    return raw.strip().lower()


@node(output_name="text")
async def aclean(raw: str) -> str:
    """An async per-item node before the batch node: the plan's items flow, and reach the
    batch node one by one (its calls are filled as they arrive)."""
    await asyncio.sleep(0.001 * (len(raw) % 3))
    return raw.strip().lower()


@node(output_name="score")
def score(size: int) -> int:
    """A per-item node after the batch node."""
    return size * 10


@node(output_name=("upper", "first"), batch_size=B)
def b_two(text: list[str], log_dir: list[str]) -> tuple[list[str], list[str]]:
    """Two outputs: a tuple of lists."""
    record(log_dir, "two", text)
    return [t.upper() for t in text], [t[:1] for t in text]


@node(output_name="size", batch_size=B)
def b_short(text: list[str], log_dir: list[str]) -> list[int]:
    """Returns one value too few for a call holding ``"short"``."""
    record(log_dir, "short", text)
    out = [len(t) for t in text]
    return out[:-1] if "short" in text else out


class BoomError(RuntimeError):
    """The whole call failed."""


@node(output_name="size", batch_size=B)
def b_boom(text: list[str], log_dir: list[str]) -> list[int]:
    """Raises for a call holding ``"boom"``."""
    record(log_dir, "boom", text)
    if "boom" in text:
        raise BoomError(f"the call of {len(text)} items failed")
    return [len(t) for t in text]


@node(output_name="size", batch_size=B, retries=2, backoff=0.01)
def b_flaky(text: list[str], log_dir: list[str]) -> list[int]:
    """Fails the first attempt of every call (keyed by the call's texts), then succeeds."""
    record(log_dir, "flaky", text)
    if sum(c == text for c in calls(log_dir[0], "flaky")) == 1:
        raise ConnectionError(f"provider hiccup for {len(text)} items")
    return [len(t) for t in text]


@node(output_name="size", batch_size=B, concurrency=1)
async def ab_serial(text: list[str], log_dir: list[str]) -> list[int]:
    """At most one call at a time: each call records when it started and ended."""
    _append(Path(log_dir[0]) / "serial.spans", f"start {time.time()!r}")
    await asyncio.sleep(0.005)
    _append(Path(log_dir[0]) / "serial.spans", f"end {time.time()!r}")
    return [len(t) for t in text]


def spans(log_dir: str) -> list[tuple[str, float]]:
    lines = (Path(log_dir) / "serial.spans").read_text().splitlines()
    return sorted(((w, float(t)) for w, t in map(str.split, lines)), key=lambda e: e[1])


@node(output_name="size", batch_size=B, timeout=0.5)
async def ab_slow(text: list[str], log_dir: list[str]) -> list[int]:
    """A call holding ``"slow"`` outlives its timeout."""
    record(log_dir, "slow", text)
    if "slow" in text:
        await asyncio.sleep(30)
    return [len(t) for t in text]


BEFORE_AFTER = {"sync": [clean, b_size, score], "async": [clean, ab_size, score],
                "flowing": [aclean, ab_size, score], "flowing-sync": [aclean, b_size, score]}
SIZE = {"sync": b_size, "async": ab_size, "flowing": ab_size, "flowing-sync": b_size}


# --------------------------------------------------------------------------- resources


@resource
def unit():
    """A resource: passed to a batch node as the object, not a list."""
    return {"unit": "chars"}


@node(output_name="labelled", batch_size=B)
def b_label(text: list[str], unit: dict, log_dir: list[str]) -> list[str]:
    assert isinstance(unit, dict), "a resource is passed as itself"
    record(log_dir, "label", text)
    return [f"{len(t)} {unit['unit']}" for t in text]


# --------------------------------------------------------------------------- nested graphs


@node(output_name="passages")
def split(document: str) -> list[str]:
    return [p for p in document.split("|") if p]


@node(output_name="total")
def total(sizes: list[int]) -> int:
    return sum(sizes)


def nested(kind: str) -> list:
    """``split`` -> the inner graph (a batch node, then ``score``; flowing kinds start with
    ``aclean``) mapped over the passages -> ``total``; ``log_dir`` is broadcast inside."""
    if kind.startswith("flowing"):
        inner, over = Graph([aclean, SIZE[kind], score], name=f"inner_{kind}"), "raw"
    else:
        inner, over = Graph([SIZE[kind], score], name=f"inner_{kind}"), "text"
    each = inner.as_node(name="each", map_over=over, inputs={"passages": over},
                         outputs={"sizes": "score"})
    return [split, each, total]


# --------------------------------------------------------------------------- scalars=


def record_once(log_dir: str, tag: str, texts: list[str], model: object) -> None:
    """A call's texts and the one value its scalar ``model`` took."""
    assert isinstance(log_dir, str), "a scalar is passed once per call, not as a list"
    _append(Path(log_dir) / f"{tag}.calls",
            json.dumps({"texts": texts, "model": model, "pid": os.getpid()}))


def model_calls(log_dir: str, tag: str = "embed") -> list[tuple[object, list[str]]]:
    """``(model, texts)`` of each call of ``tag`` so far."""
    path = Path(log_dir) / f"{tag}.calls"
    if not path.exists():
        return []
    return [(c["model"], c["texts"]) for c in map(json.loads, path.read_text().splitlines())]


class ModelDownError(RuntimeError):
    """The whole call failed: its model is down."""


def embed(text: list[str], model: str) -> list:
    """One value per text (``"bad..."``: a ``ValueError`` in its slot); model ``"down"``
    fails the call."""
    if model == "down":
        raise ModelDownError(f"model 'down' refused a call of {len(text)} items")
    return [ValueError(f"bad text {t!r}") if t.startswith("bad") else f"{model}:{t}"
            for t in text]


@node(output_name="vector", batch_size=B, scalars=("model", "log_dir"))
def b_embed(text: list[str], model: str, log_dir: str) -> list[str]:
    record_once(log_dir, "embed", text, model)
    return embed(text, model)


@node(output_name="vector", batch_size=B, scalars=("model", "log_dir"))
async def ab_embed(text: list[str], model: str, log_dir: str) -> list[str]:
    record_once(log_dir, "embed", text, model)
    await asyncio.sleep(0.002)
    return embed(text, model)


EMBED = {"sync": [clean, b_embed], "async": [clean, ab_embed],
         "flowing": [aclean, ab_embed], "flowing-sync": [aclean, b_embed]}


# Translated from Daft's ``test_udf`` (``repeat_n(col("a"), 2)``: ``n`` is a literal
# argument, one value for the whole batch) and Ray Data's ``map_batches(fn,
# fn_kwargs={"n": 2})``: a batch function takes a broadcast value as one value per call.


@node(output_name="repeated", batch_size=2, scalars="n")
def repeat_n(data: list[str], n: int) -> list[str]:
    assert isinstance(n, int), f"n is one value per call, got {type(n).__name__}"
    return [d * n for d in data]


@node(output_name="total", batch_size=2, scalars=("b",))
def sum_with_scalar(x: list[int], b: int) -> list[int]:
    """Daft's ``test_batch_udf_with_literal``: ``my_sum_with_scalar(col("x"), 10)``."""
    assert isinstance(b, int), f"b is one value per call, got {type(b).__name__}"
    return [v + b for v in x]
