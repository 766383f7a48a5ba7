"""``graph.visualize()``: Mermaid always; DOT text; SVG/PNG through graphviz when present."""

from __future__ import annotations

import sys
import types
from typing import Literal

import pytest

from hypernodes_dist import END, Graph, InterruptNode, branch, gate, node
from hypernodes_dist import visualize as viz


@node(output_name="doc")
def load(path: str) -> str:
    return path


@branch(when_true="summarize", when_false="keep")
def is_long(doc: str) -> bool:
    return len(doc) > 10


@node(output_name="summary")
def summarize(doc: str) -> str:
    return doc[:10]


@node(output_name="summary")
def keep(doc: str) -> str:
    return doc


@gate
def review(summary: str) -> Literal[("polish", "needs work"), (END, "good enough")]:
    return END


@node(output_name="final")
def polish(summary: str, style: str = "plain") -> str:
    return summary


GRAPH = Graph([load, is_long, summarize, keep, review, polish], name="docs")


def test_mermaid_has_inputs_nodes_outputs_and_control_edges():
    text = GRAPH.visualize()
    assert text.startswith("flowchart TD\n")
    assert 'in_path[/"path"/]' in text and 'in_style[/"style"/]' in text
    assert 'node_is_long{"is_long<br/>branch"}' in text
    assert 'node_review{{"review<br/>gate"}}' in text
    assert 'out_final(("final"))' in text
    assert 'node_load -->|"doc"| node_summarize' in text
    assert 'node_is_long -.->|"true"| node_summarize' in text
    assert 'node_is_long -.->|"false"| node_keep' in text
    assert 'node_review -.->|"needs work"| node_polish' in text
    assert 'node_review -.->|"good enough"| END' in text
    assert "END((END))" in text


def test_interrupt_and_quotes_in_mermaid():
    ask = InterruptNode(name="ask", input_param="question", response_param="answer")

    @node(output_name='said "hi"')
    def reply(answer: str) -> str:
        return answer

    text = Graph([ask, reply]).visualize(direction="LR")
    assert text.startswith("flowchart LR")
    assert 'node_ask(["ask<br/>interrupt → answer"])' in text
    assert "#quot;hi#quot;" in text


def test_dot_text_and_files(tmp_path):
    dot = GRAPH.visualize(format="dot")
    assert dot.startswith('digraph "docs" {')
    assert '"node:is_long" -> "node:summarize" [label="true", style=dashed' in dot
    assert '"node:review" -> "END" [label="good enough"' in dot
    assert "shape=hexagon" in dot and "shape=diamond" in dot
    GRAPH.visualize(tmp_path / "g.mmd")
    GRAPH.visualize(tmp_path / "g.gv")
    assert (tmp_path / "g.mmd").read_text().startswith("flowchart")
    assert (tmp_path / "g.gv").read_text().startswith("digraph")
    with pytest.raises(ValueError, match="unknown visualize format"):
        GRAPH.visualize(format="jpeg")


def test_svg_without_graphviz_explains(monkeypatch):
    monkeypatch.setattr(viz, "graphviz_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs Graphviz"):
        GRAPH.visualize(format="svg")


def test_svg_and_png_go_through_graphviz_when_available(monkeypatch, tmp_path):
    seen = {}

    class Source:
        def __init__(self, source):
            seen["source"] = source

        def pipe(self, format):
            seen.setdefault("formats", []).append(format)
            return b"<svg/>" if format == "svg" else b"\x89PNG fake"

    monkeypatch.setitem(sys.modules, "graphviz", types.SimpleNamespace(Source=Source))
    monkeypatch.setattr(viz.shutil, "which", lambda name: "/usr/bin/dot")
    assert viz.graphviz_available()
    assert GRAPH.visualize(format="svg") == "<svg/>"
    assert GRAPH.visualize(tmp_path / "g.png") == b"\x89PNG fake"
    assert (tmp_path / "g.png").read_bytes() == b"\x89PNG fake"
    assert seen["source"].startswith('digraph "docs"') and seen["formats"] == ["svg", "png"]


def test_real_graphviz_if_installed(tmp_path):
    if not viz.graphviz_available():
        pytest.skip("graphviz package or dot binary not installed")
    assert "<svg" in GRAPH.visualize(tmp_path / "g.svg")
