"""Daft variants of the conformance engine fixture (native runner; Ray has its own smoke test)."""

from __future__ import annotations

from hypernodes_daft import DaftEngine

ENGINES = [
    ("daft", DaftEngine),
    ("daft-batch7", lambda: DaftEngine(batch_size=7)),
]
