"""The cache: content-hashed keys (``keys``, ``hashing``) and the stores that hold values.

``DiskCache`` (``disk``) is the embedded store for one machine. It loads on first use, so
``import hypernodes_dist`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hypernodes_dist.cache.disk import DiskCache

__all__ = ["DiskCache"]


def __getattr__(name: str) -> Any:
    if name in ("DiskCache", "SCOPES", "MISSING"):
        from hypernodes_dist.cache import disk

        return getattr(disk, name)
    raise AttributeError(f"module 'hypernodes_dist.cache' has no attribute {name!r}")
