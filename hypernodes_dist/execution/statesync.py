"""State sync for UIs: ``StateSnapshotEvent`` (the whole state) and ``StateDeltaEvent``
(RFC 6902 JSON Patch operations).

The run's state is a flat mapping ``name -> value``, so every operation targets a top-level
member: ``{"op": "add" | "replace", "path": "/<name>", "value": v}`` with the name escaped
as a JSON Pointer token (``~`` -> ``~0``, ``/`` -> ``~1``). Values are the Python objects
themselves (not JSON-encoded): a UI adapter serialises what it forwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["pointer", "unpointer", "delta_ops", "apply_patch"]


def pointer(name: str) -> str:
    """The JSON Pointer of top-level member ``name``."""
    return "/" + name.replace("~", "~0").replace("/", "~1")


def unpointer(path: str) -> str:
    """Inverse of ``pointer`` for a top-level path."""
    if not path.startswith("/"):
        raise ValueError(f"JSON Pointer must start with '/', got {path!r}")
    return path[1:].replace("~1", "/").replace("~0", "~")


def delta_ops(before: Mapping[str, Any], writes: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON Patch turning ``before`` into ``before`` updated with ``writes``."""
    return [
        {"op": "replace" if name in before else "add", "path": pointer(name), "value": value}
        for name, value in writes.items()
    ]


def apply_patch(state: Mapping[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """A new dict: ``state`` with top-level ``add``/``replace``/``remove`` operations applied."""
    out = dict(state)
    for op in operations:
        name = unpointer(op["path"])
        kind = op["op"]
        if kind in ("add", "replace"):
            if kind == "replace" and name not in out:
                raise KeyError(f"replace of absent member {op['path']!r}")
            out[name] = op["value"]
        elif kind == "remove":
            del out[name]
        else:
            raise ValueError(f"unsupported JSON Patch op {kind!r}")
    return out
