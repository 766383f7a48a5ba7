"""``_hn_manifest.json``: what an ``into=`` directory holds the results of.

It records the graph (structure and each node's code identity), the broadcast inputs (but
the values of ``unkeyed`` ones: inputs only resources read and name in ``not_in_key``, such
as an API key or an endpoint; a change of those resumes the map), the source fingerprint, the column binding, ``keep`` and the outputs, plus the partitioning
(rows per part) and the output schema. A rerun of the same map reuses the partitioning and
schema and skips every part whose file exists; anything else that differs raises
``ValueError`` naming what changed, unless ``overwrite=True``.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from hypernodes_dist.cache.hashing import hash_value
from hypernodes_dist.datasets.source import Source
from hypernodes_dist.plan import Plan
from hypernodes_dist.sinks.parquet import MANIFEST, ParquetDataset

__all__ = ["new_manifest", "check_manifest", "encode", "schema_of"]

FORMAT = 1
_IDENTITY = ("graph", "code", "inputs", "source", "columns", "keep", "outputs")


def new_manifest(plan: Plan, source: Source, mapping: dict[str, str], keep: Sequence[str],
                 outputs: Sequence[str], broadcast: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "graph": plan.graph_hash,
        "code": plan.code_ids(every=True),
        "inputs": {k: _value_id(v) for k, v in sorted(broadcast.items())
                   if k not in plan.unkeyed},
        "unkeyed": sorted(plan.unkeyed),
        "source": source.fingerprint(),
        "source_kind": source.kind,
        "rows": source.n,
        "columns": dict(sorted(mapping.items())),
        "keep": list(keep),
        "outputs": list(outputs),
    }


def _value_id(value: Any) -> str:
    try:
        return hash_value(value)
    except Exception:  # unhashable broadcast value (a client, a lock): its type only
        return f"unhashable:{type(value).__qualname__}"


def encode(manifest: dict[str, Any]) -> dict[str, Any]:
    """The JSON form (the schema as base64 Arrow IPC)."""
    out = dict(manifest)
    schema = out.pop("schema")
    out["schema"] = base64.b64encode(schema.serialize().to_pybytes()).decode()
    return out


def schema_of(manifest: dict[str, Any]) -> pa.Schema:
    """The output schema recorded in a manifest."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(manifest["schema"])))


def check_manifest(out: ParquetDataset, manifest: dict[str, Any],
                   overwrite: bool) -> tuple[int, pa.Schema] | None:
    """``(rows per part, schema)`` of the same map found in ``out``; ``None`` to start
    fresh (clearing a previous map's files when ``overwrite``)."""
    strangers = out.unknown_files()
    if strangers:
        raise ValueError(
            f"into={out.location!r} holds files this map did not write "
            f"({', '.join(strangers[:5])}); write into an empty or new directory")
    old = out.read_manifest()
    parts = out.finished()
    if overwrite:
        out.clear()
        return None
    if old is None:
        if parts:
            raise ValueError(
                f"into={out.location!r} holds part files but no {MANIFEST}: it is not known "
                "which map wrote them; pass overwrite=True to replace them")
        return None
    changes = _changes(old, manifest)
    if changes:
        raise ValueError(
            f"into={out.location!r} holds the results of a different map: "
            f"{'; '.join(changes)}. Pass overwrite=True to replace them, or write into "
            "another directory")
    return int(old["rows_per_part"]), schema_of(old)


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    if old.get("format") != FORMAT:
        return [f"it was written by another manifest format ({old.get('format')})"]
    out: list[str] = []
    if old["graph"] != new["graph"]:
        out.append("the graph changed (nodes, wiring or outputs differ)")
    else:
        code = [k for k in new["code"] if old["code"].get(k) != new["code"][k]]
        if code:
            out.append(f"the code of node(s) {', '.join(map(repr, code))} changed")
    unkeyed = {*new["unkeyed"]}  # also out of the identity when an older manifest has them
    inputs = sorted(k for k in {*old["inputs"], *new["inputs"]} - unkeyed
                    if old["inputs"].get(k) != new["inputs"].get(k))
    if inputs:
        out.append(f"the broadcast input(s) {', '.join(map(repr, inputs))} changed")
    if old["source"] != new["source"]:
        out.append(f"the source changed ({old['source_kind']} with {old['rows']} rows before, "
                   f"{new['source_kind']} with {new['rows']} rows now, different content)")
    for key, what in (("columns", "the column binding (columns=)"), ("keep", "keep="),
                      ("outputs", "the selected outputs (select=)")):
        if old[key] != new[key]:
            out.append(f"{what} changed: {old[key]} before, {new[key]} now")
    return out
