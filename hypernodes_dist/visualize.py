"""``graph.visualize()``: the static graph as Mermaid (always) or Graphviz DOT / SVG / PNG.

The picture shows graph inputs, nodes (functions, branches, gates, interrupts, nested
graphs), data edges labelled with the value they carry, outputs nobody consumes, and the
control edges of branches (``true`` / ``false``) and gates (each choice with its
description; ``END`` as a terminal). SVG and PNG need the ``graphviz`` Python package and
the ``dot`` binary; both are detected, never required: Mermaid and DOT text always work.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hypernodes_dist.nodes import END, BranchNode, GateNode, HyperNode
from hypernodes_dist.plan import PlannedGraph

__all__ = ["to_mermaid", "to_dot", "visualize", "graphviz_available", "structure"]

_FORMATS = ("mermaid", "dot", "svg", "png")


@dataclass(frozen=True)
class _Edge:
    src: str
    dst: str
    label: str
    control: bool  # a branch/gate activation (dashed)


@dataclass(frozen=True)
class _Structure:
    inputs: tuple[str, ...]
    nodes: tuple[HyperNode, ...]
    sinks: tuple[str, ...]  # outputs no node consumes
    edges: tuple[_Edge, ...]
    has_end: bool


def structure(graph: PlannedGraph) -> _Structure:
    """Vertices and edges of the static picture (ids: ``in:x``, ``node:f``, ``out:y``, ``END``)."""
    plan = graph.plan
    consumed = {p for n in plan.nodes for p in n.params}
    edges: list[_Edge] = []
    for n in plan.nodes:
        for p in n.params:
            if p in plan.producers:
                edges.extend(_Edge(f"node:{src}", f"node:{n.name}", p, False)
                             for src in plan.producers[p])
            elif p in plan.inputs:
                edges.append(_Edge(f"in:{p}", f"node:{n.name}", "", False))
    has_end = False
    for n in plan.nodes:
        if n.kind == "branch":
            branch = cast(BranchNode, n)
            edges.append(_Edge(f"node:{n.name}", f"node:{branch.when_true}", "true", True))
            edges.append(_Edge(f"node:{n.name}", f"node:{branch.when_false}", "false", True))
        elif n.kind == "gate":
            gate = cast(GateNode, n)
            for choice in gate.choices:
                desc = gate.descriptions.get(choice, "")
                if choice is END or choice == END:
                    has_end = True
                    edges.append(_Edge(f"node:{n.name}", "END", desc or "END", True))
                else:
                    edges.append(_Edge(f"node:{n.name}", f"node:{choice}", desc or choice, True))
    sinks = tuple(o for o in plan.outputs if o not in consumed)
    for o in sinks:
        edges.extend(_Edge(f"node:{src}", f"out:{o}", "", False) for src in plan.producers[o])
    used_inputs = tuple(i for i in plan.inputs if i in consumed)
    return _Structure(used_inputs, plan.nodes, sinks, tuple(edges), has_end)


def _node_label(n: HyperNode) -> str:
    kind = {"branch": "branch", "gate": "gate", "interrupt": "interrupt"}.get(n.kind, "")
    if getattr(n, "nests", False):
        kind = "graph"
    extra = []
    if kind:
        extra.append(kind)
    if n.outputs:
        extra.append("→ " + ", ".join(n.outputs))
    return n.name + ("\n" + " ".join(extra) if extra else "")


# ============================================================================ mermaid


def _mid(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", key)


def _mtext(text: str) -> str:
    return '"' + text.replace('"', "#quot;").replace("\n", "<br/>") + '"'


def to_mermaid(graph: PlannedGraph, direction: str = "TD") -> str:
    """Mermaid ``flowchart`` text of the graph (renders on GitHub, in mermaid.live...)."""
    s = structure(graph)
    lines = [f"flowchart {direction}"]
    for i in s.inputs:
        lines.append(f"    {_mid('in:' + i)}[/{_mtext(i)}/]")
    for n in s.nodes:
        key, label = _mid("node:" + n.name), _mtext(_node_label(n))
        if n.kind == "branch":
            lines.append(f"    {key}{{{label}}}")
        elif n.kind == "gate":
            lines.append(f"    {key}{{{{{label}}}}}")
        elif n.kind == "interrupt":
            lines.append(f"    {key}([{label}])")
        elif getattr(n, "nests", False):
            lines.append(f"    {key}[[{label}]]")
        else:
            lines.append(f"    {key}[{label}]")
    for o in s.sinks:
        lines.append(f"    {_mid('out:' + o)}(({_mtext(o)}))")
    if s.has_end:
        lines.append("    END((END))")
    for e in s.edges:
        arrow = "-.->" if e.control else "-->"
        label = f"|{_mtext(e.label)}|" if e.label else ""
        lines.append(f"    {_mid(e.src)} {arrow}{label} {_mid(e.dst)}")
    return "\n".join(lines) + "\n"


# ============================================================================ dot


def _dq(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(graph: PlannedGraph, direction: str = "TB") -> str:
    """Graphviz DOT text of the graph."""
    s = structure(graph)
    rankdir = {"TD": "TB"}.get(direction, direction)
    lines = [f"digraph {_dq(graph.name)} {{", f"  rankdir={rankdir};",
             '  node [fontname="Helvetica", fontsize=11];',
             '  edge [fontname="Helvetica", fontsize=9];']
    for i in s.inputs:
        lines.append(f"  {_dq('in:' + i)} [label={_dq(i)}, shape=parallelogram, "
                     'style=filled, fillcolor="#eef5ff"];')
    shapes = {"branch": "diamond", "gate": "hexagon", "interrupt": "octagon"}
    for n in s.nodes:
        shape = "box3d" if getattr(n, "nests", False) else shapes.get(n.kind, "box")
        fill = "#fff4e0" if n.kind in shapes else "#ffffff"
        lines.append(f"  {_dq('node:' + n.name)} [label={_dq(_node_label(n))}, shape={shape}, "
                     f'style="rounded,filled", fillcolor="{fill}"];')
    for o in s.sinks:
        lines.append(f"  {_dq('out:' + o)} [label={_dq(o)}, shape=ellipse, style=filled, "
                     'fillcolor="#eaffea"];')
    if s.has_end:
        lines.append('  "END" [label="END", shape=doublecircle];')
    for e in s.edges:
        attrs = [f"label={_dq(e.label)}"] if e.label else []
        if e.control:
            attrs += ["style=dashed", 'color="#c05000"', 'fontcolor="#c05000"']
        lines.append(f"  {_dq(e.src)} -> {_dq(e.dst)}" + (f" [{', '.join(attrs)}]" if attrs else "")
                     + ";")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ============================================================================ visualize


def graphviz_available() -> bool:
    """True when SVG/PNG can be rendered: the ``graphviz`` package and the ``dot`` binary."""
    try:
        import graphviz  # noqa: F401
    except ImportError:
        return False
    return shutil.which("dot") is not None


def visualize(graph: PlannedGraph, path: str | Path | None = None, format: str | None = None,
              direction: str = "TD") -> Any:
    """Render the static graph.

    With no ``path`` and no ``format``: Mermaid text. ``format`` is one of ``mermaid``,
    ``dot``, ``svg``, ``png`` (default: from ``path``'s suffix; ``.mmd``/``.md`` -> mermaid,
    ``.gv`` -> dot). Text formats return ``str``; ``png`` returns ``bytes``. With ``path``
    the result is also written there. SVG/PNG raise ``RuntimeError`` when graphviz is not
    available (see ``graphviz_available()``).
    """
    fmt = format or _format_of(path)
    if fmt not in _FORMATS:
        raise ValueError(f"unknown visualize format {fmt!r}; use one of {', '.join(_FORMATS)}")
    out: str | bytes
    if fmt == "mermaid":
        out = to_mermaid(graph, direction)
    elif fmt == "dot":
        out = to_dot(graph, direction)
    else:
        if not graphviz_available():
            raise RuntimeError(
                f"graph.visualize(format={fmt!r}) needs Graphviz: pip install graphviz and the "
                "'dot' binary (apt install graphviz / brew install graphviz); Mermaid "
                "(format='mermaid') and DOT (format='dot') text need nothing"
            )
        import graphviz

        rendered = graphviz.Source(to_dot(graph, direction)).pipe(format=fmt)
        out = rendered.decode("utf-8") if fmt == "svg" else rendered
    if path is not None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(out, bytes):
            target.write_bytes(out)
        else:
            target.write_text(out, encoding="utf-8")
    return out


def _format_of(path: str | Path | None) -> str:
    if path is None:
        return "mermaid"
    suffix = Path(path).suffix.lower().lstrip(".")
    return {"mmd": "mermaid", "md": "mermaid", "mermaid": "mermaid", "gv": "dot",
            "dot": "dot", "svg": "svg", "png": "png"}.get(suffix, suffix or "mermaid")
