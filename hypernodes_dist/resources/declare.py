"""``@resource``: a function (sync or async; a generator yields the object and its code after
``yield`` is the teardown) whose value nodes receive by a parameter of the same name."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, overload

from hypernodes_dist.policies.spec import Policy, resource_limits

__all__ = ["Resource", "resource"]


class Resource:
    """A declared resource: its function, name, ``version``, ``not_in_key`` (inputs it
    reads that do not change results) and ``limits`` (its ``concurrency`` / ``rate_limit``,
    a ``Policy`` or ``None``); never its built object (that lives in each process's
    registry, ``resources.registry``)."""

    kind = "resource"

    def __init__(self, func: Callable[..., Any], name: str | None = None,
                 version: str | None = None, not_in_key: str | Iterable[str] = (),
                 concurrency: int | None = None, rate_limit: Any = None) -> None:
        if not callable(func):
            raise TypeError(f"@resource needs a function, got {type(func).__name__}")
        self.func = func
        self.name = name or func.__name__
        if not self.name.isidentifier():
            raise ValueError(f"resource name must be a parameter name, got {self.name!r}")
        self.version = None if version is None else str(version)
        sig = inspect.signature(func)
        self.params = tuple(sig.parameters)
        self.defaults = {k: p.default for k, p in sig.parameters.items()
                         if p.default is not inspect.Parameter.empty}
        self.is_async = inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)
        self.is_generator = inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func)
        self.not_in_key = _not_in_key(self.name, not_in_key, self.params)
        self.limits: Policy | None = resource_limits(self.name, concurrency, rate_limit)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        version = "" if self.version is None else f", version={self.version!r}"
        return f"Resource({self.name!r}, params={list(self.params)}{version})"


def _not_in_key(name: str, names: str | Iterable[str], params: tuple[str, ...]
                ) -> frozenset[str]:
    """The inputs of resource ``name`` left out of cache keys (each one of its parameters)."""
    found = (names,) if isinstance(names, str) else tuple(names)
    for p in found:
        if not isinstance(p, str) or p not in params:
            raise ValueError(
                f"resource {name!r}: not_in_key names {p!r}, which is not one of its "
                f"parameters ({', '.join(params) or 'none'}); list parameter names in "
                "not_in_key=")
    return frozenset(found)


@overload
def resource(func: Callable[..., Any], /) -> Resource: ...
@overload
def resource(*, name: str | None = None, version: str | None = None,
             not_in_key: str | Iterable[str] = (), concurrency: int | None = None,
             rate_limit: Any = None) -> Callable[[Callable[..., Any]], Resource]: ...


def resource(func: Callable[..., Any] | None = None, /, *, name: str | None = None,
             version: str | None = None, not_in_key: str | Iterable[str] = (),
             concurrency: int | None = None, rate_limit: Any = None) -> Any:
    """Declare a resource: ``@resource`` or ``@resource(name=..., version=...,
    not_in_key=..., concurrency=..., rate_limit=...)``.

    Built lazily at most once per worker process (and event loop), reused by every call
    there, torn down when the engine closes or the process ends; never pickled, shipped or
    hashed by value. Its code identity (or ``version``) is part of the cache key of every
    node that receives it, and so is every input it reads, except those named in
    ``not_in_key`` (a key, an endpoint: they do not change results), which stay out of
    cache keys and of a dataset map's identity (``ValueError`` if one is not a parameter).
    ``concurrency`` / ``rate_limit`` (as a node's) bound the calls of every node receiving
    it together, in every process; with neither, the limits its client's provider states
    in response headers are learned (``policies/learned.py``).
    """
    if func is not None:
        return Resource(func)

    def wrap(fn: Callable[..., Any]) -> Resource:
        return Resource(fn, name=name, version=version, not_in_key=not_in_key,
                        concurrency=concurrency, rate_limit=rate_limit)

    return wrap
