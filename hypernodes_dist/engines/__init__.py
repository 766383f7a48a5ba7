"""Engine plugins, found through the ``hypernodes_dist.engines`` entry-point group.

``from hypernodes_dist.engines import DaskEngine`` imports the plugin only when asked, so
``import hypernodes_dist`` never imports dask or daft. ``get_engine("dask")`` looks an
engine up by its entry-point name; ``available()`` lists the installed ones.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from hypernodes_dist.engines.base import Engine
from hypernodes_dist.engines.local import GraphEngine
from hypernodes_dist.errors import EngineNotFoundError

__all__ = ["Engine", "GraphEngine", "available", "get_engine", "resolve", "refresh"]

GROUP = "hypernodes_dist.engines"


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def refresh() -> None:
    """Forget the cached plugin list (after installing a plugin at run time)."""
    _entry_points.cache_clear()


def available() -> list[str]:
    """Names of the installed engines (``local`` is built in)."""
    return sorted({"local", *_entry_points()})


def get_engine(name: str) -> type[Engine]:
    """The engine class registered under ``name``; ``EngineNotFoundError`` lists the others."""
    if name in ("local", "graph"):
        return GraphEngine
    ep = _entry_points().get(name)
    if ep is None:
        raise EngineNotFoundError(
            f"no engine named {name!r} is installed; installed engines: {', '.join(available())}"
        )
    try:
        return ep.load()
    except ImportError as exc:
        raise ImportError(
            f"engine {name!r} is installed ({ep.value}) but failed to import: {exc}"
        ) from exc


def resolve(engine: Engine | str | None) -> Engine:
    """An engine instance from an instance, an entry-point name, or ``None`` (local)."""
    if engine is None:
        return GraphEngine()
    if isinstance(engine, str):
        return get_engine(engine)()
    if not isinstance(engine, Engine):
        raise TypeError(f"engine must be an Engine or an engine name, got {type(engine).__name__}")
    return engine


def __getattr__(attr: str) -> Any:
    """``DaskEngine`` -> the class of the entry point whose class name is ``DaskEngine``."""
    if attr.startswith("_"):
        raise AttributeError(attr)
    for ep in _entry_points().values():
        if ep.value.rsplit(":", 1)[-1] == attr:
            return ep.load()
    raise AttributeError(
        f"module 'hypernodes_dist.engines' has no engine class {attr!r}; installed engines: "
        f"{', '.join(available())}"
    )
