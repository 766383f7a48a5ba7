"""``@resource``: a function (sync or async; a generator yields the object and its code after
``yield`` is the teardown) whose value nodes receive by a parameter of the same name."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, overload

__all__ = ["Resource", "resource"]


class Resource:
    """A declared resource: its function, name and ``version``; never its built object (that
    lives in each process's registry, ``resources.registry``)."""

    kind = "resource"

    def __init__(self, func: Callable[..., Any], name: str | None = None,
                 version: str | None = None) -> None:
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

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        version = "" if self.version is None else f", version={self.version!r}"
        return f"Resource({self.name!r}, params={list(self.params)}{version})"


@overload
def resource(func: Callable[..., Any], /) -> Resource: ...
@overload
def resource(*, name: str | None = None,
             version: str | None = None) -> Callable[[Callable[..., Any]], Resource]: ...


def resource(func: Callable[..., Any] | None = None, /, *, name: str | None = None,
             version: str | None = None) -> Any:
    """Declare a resource: ``@resource`` or ``@resource(name=..., version=...)``.

    Built lazily at most once per worker process (and event loop), reused by every call
    there, torn down when the engine closes or the process ends; never pickled, shipped or
    hashed by value. Its code identity (or ``version``) is part of the cache key of every
    node that receives it.
    """
    if func is not None:
        return Resource(func)

    def wrap(fn: Callable[..., Any]) -> Resource:
        return Resource(fn, name=name, version=version)

    return wrap
