"""Nested graphs of the conformance suite (module level: worker processes import them)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from hypernodes_dist import Graph, node


@node(output_name="passages")
def split(document: str) -> list:
    return [p for p in document.split("|") if p] if document else []


@node(output_name="embedding")
def embed(passage: str, dim: int = 2) -> list:
    return [len(passage), passage.count("a")][:dim]


@node(output_name="norm")
def norm(embedding: list) -> int:
    return sum(embedding)


INNER = Graph([embed, norm], name="embedder")
EMBED_EACH = INNER.as_node(name="embed_each", map_over="passage",
                           inputs={"passages": "passage"}, outputs={"norms": "norm"})


@node(output_name="score")
def total(norms: list) -> int:
    return sum(norms)


OUTER = [split, EMBED_EACH, total]

DOC_LEVEL = Graph(OUTER, name="doc")
CORPUS = DOC_LEVEL.as_node(name="per_doc", map_over="document",
                           inputs={"documents": "document"}, outputs={"scores": "score"})


@node(output_name="best")
def best(scores: list) -> int:
    return max(scores) if scores else -1


TWO_LEVEL = [CORPUS, best]


def expected_norms(document: str, dim: int = 2) -> list:
    return [sum([len(p), p.count("a")][:dim]) for p in document.split("|") if p]


# ------------------------------------------------------------------ edges (issue 27)


def _mark(log_dir: str, name: str) -> None:
    Path(log_dir, f"{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}").touch()


def calls(log_dir: str, name: str) -> int:
    return sum(1 for f in Path(log_dir).iterdir() if f.name.startswith(f"{name}-"))


@node(output_name="a")
def cheap(x: int, log_dir: str) -> int:
    _mark(log_dir, "cheap")
    return x + 1


@node(output_name="b")
def paid(x: int, log_dir: str) -> int:
    _mark(log_dir, "paid")
    return x * 100


BOTH = Graph([cheap, paid], name="both")
ONLY_A = BOTH.as_node(name="only_a", outputs={"only_a": "a"})


@node(output_name="checked")
def check(x: int) -> int:
    if x == 2:
        raise ValueError(f"inner check failed for {x}")
    return x


@node(output_name="after")
def after_check(checked: int) -> int:
    return checked + 1


CHECKER = Graph([check, after_check], name="checker").as_node(name="checking")
