"""The cache: content-hashed keys (``keys``, ``hashing``, ``codeid``) and the stores.

``Cache`` (``base``) is the protocol every store implements and the one place a new backend
plugs in. ``DiskCache`` (``disk``) is the embedded store of one machine; ``ObjectStoreCache``
(``objectstore``) keeps the same keys on storage many machines share (``s3://``, ``gs://``,
any ``pyarrow.fs`` / ``fsspec`` URI, a shared directory). Both build on ``segcache`` and
``segments`` and load on first use, so ``import hypernodes_dist`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hypernodes_dist.cache import codeid  # noqa: F401 - installs the code identity of functions
from hypernodes_dist.cache.base import SCOPES, Cache, CacheNotVisibleError
from hypernodes_dist.missing import MISSING

if TYPE_CHECKING:
    from hypernodes_dist.cache.disk import DiskCache
    from hypernodes_dist.cache.objectstore import ObjectStoreCache

__all__ = ["Cache", "CacheNotVisibleError", "DiskCache", "MISSING", "ObjectStoreCache", "SCOPES"]


def __getattr__(name: str) -> Any:
    if name == "DiskCache":
        from hypernodes_dist.cache.disk import DiskCache

        return DiskCache
    if name == "ObjectStoreCache":
        from hypernodes_dist.cache.objectstore import ObjectStoreCache

        return ObjectStoreCache
    raise AttributeError(f"module 'hypernodes_dist.cache' has no attribute {name!r}")
