"""Nested graphs of the conformance suite (module level: worker processes import them)."""

from __future__ import annotations

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
