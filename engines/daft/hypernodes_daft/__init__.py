"""hypernodes-dist engine plugin: ``map()`` as a Daft DataFrame pipeline (native or Ray)."""

from .engine import DaftEngine

__all__ = ["DaftEngine"]
