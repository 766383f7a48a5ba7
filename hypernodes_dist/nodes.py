"""Node IR: ``@node``, ``@branch``, ``@gate``, ``END`` and ``InterruptNode``.

A node describes one step of a graph: its name, the parameters it reads (with their
defaults), the names it writes, and how to call it. Building a ``Graph`` may complete that
description (``resources.bind`` adds the resources a node receives to its identity);
nothing changes it after that. Edges between
nodes are never declared; the graph infers them from parameter and output names.
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar

from hypernodes_dist.policies import make_policy
from hypernodes_dist.policies.signals import MAX_RETRY_AFTER
from hypernodes_dist.policies.usage import may_meter, seen_metering

__all__ = [
    "END",
    "HyperNode",
    "FunctionNode",
    "BranchNode",
    "GateNode",
    "InterruptNode",
    "node",
    "branch",
    "gate",
]

NodeKind = Literal["function", "branch", "gate", "interrupt", "graph"]
N = TypeVar("N", bound="HyperNode")


class _End(str):
    """The ``END`` sentinel a gate returns to stop the run. It is a ``str`` so it fits in ``Literal``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "END"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_end, ())


def _end() -> _End:
    return END


END: _End = _End("__END__")


class HyperNode:
    """Base class of every graph node; the attributes are the node's whole IR."""

    kind: NodeKind = "function"
    nests: bool = False  # runs a graph of its own (Graph.as_node)
    inner_interrupts: tuple[InterruptNode, ...] = ()  # a nested graph's (they pause its runs)

    def __init__(
        self,
        *,
        name: str,
        params: Sequence[str],
        defaults: dict[str, Any],
        outputs: Sequence[str],
        func: Callable[..., Any] | None,
        tags: Iterable[str] = (),
        cache: bool = True,
        streaming: bool = False,
        retries: int = 0,
        backoff: Any = None,
        timeout: float | None = None,
        version: str | None = None,
        concurrency: int | None = None,
        rate_limit: Any = None,
        retry_on: Any = Exception,
        batch_size: int | None = None,
        scalars: str | Iterable[str] = (),
        max_retry_after: Any = MAX_RETRY_AFTER,
        batch_api: bool = False,
        online_after: float | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"node name must be a non-empty string, got {name!r}")
        # validated here; None when no policy is set (executors then add no wrapper at all)
        self.policy = make_policy(name, retries, backoff, timeout, concurrency, rate_limit,
                                  retry_on, max_retry_after)
        self.name = name
        self.params = tuple(params)
        self.defaults = dict(defaults)
        self.outputs = tuple(outputs)
        self.func = _by_reference(func)
        self.code = func  # whose code is the node's identity (``resources.bind`` keeps it)
        self.salt: tuple[str, ...] = ()  # more identity: the resources it receives
        self.resources: tuple[str, ...] = ()  # parameters bound to resources
        self.tags = tuple(tags)
        self.cache = cache
        self.version = version
        self.is_async = func is not None and (
            inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)
        )
        self.is_generator = func is not None and (
            inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func)
        )
        self.streaming = bool(streaming) or self.is_generator
        self.batch_size = _batch_size(name, batch_size, self.streaming)
        self.scalars = _scalars(name, scalars, self.params)
        self.batch_api, self.online_after = _batch_api(name, batch_api, online_after,
                                                       self.streaming, self.batch_size)
        self.unkeyed: frozenset[str] = frozenset()  # inputs left out of its cache key
        # a stream that yields nothing is the empty value of its kind ([], "", b"", {})
        self.empty: type = _stream_kind(func) if self.streaming and func is not None else list

    @property
    def meters(self) -> bool:
        """Whether calls of this node may ``meter`` usage (its code names ``meter``, it has a
        ``rate_limit`` on a metered quantity, or it was seen metering in this process)."""
        found = self.__dict__.get("_meters")
        if found is None:
            quantities = self.policy is not None and self.policy.meters
            found = self._meters = quantities or (
                self.code is not None and may_meter(self.code))
        return found or seen_metering(self.name)

    @property
    def guarded(self) -> bool:
        """Whether calls go through the guard (``execution/guard.py``): a policy or usage."""
        return self.policy is not None or self.meters

    @property
    def targets(self) -> tuple[str, ...]:
        """Nodes this node activates (branch and gate only)."""
        return ()

    @property
    def can_end(self) -> bool:
        """Whether this node may end the run (a gate with ``END`` among its choices)."""
        return False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.func is None:
            raise TypeError(f"node {self.name!r} is not callable")
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        outs = ", ".join(self.outputs)
        return f"{type(self).__name__}({self.name!r}, params={list(self.params)}, outputs=[{outs}])"


def _batch_size(name: str, size: Any, streaming: bool) -> int | None:
    """A valid ``batch_size`` (``None``: called once per item)."""
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"node {name!r}: batch_size must be None or an int >= 1, got {size!r}")
    if streaming:
        raise ValueError(f"node {name!r}: a streaming node cannot have a batch_size (its "
                         "chunks belong to one item); drop batch_size or streaming")
    return size


def _batch_api(name: str, batch_api: Any, online_after: Any, streaming: bool,
               batch_size: int | None) -> tuple[bool, float | None]:
    """Valid ``batch_api`` / ``online_after`` (provider Batch APIs, ``batchapi/``)."""
    if not isinstance(batch_api, bool):
        raise ValueError(f"node {name!r}: batch_api must be True or False, got {batch_api!r}")
    if online_after is not None:
        if not batch_api:
            raise ValueError(f"node {name!r}: online_after applies to batch_api=True nodes "
                             "(how long a batch may run before its requests go online)")
        if (isinstance(online_after, bool) or not isinstance(online_after, (int, float))
                or not online_after > 0):
            raise ValueError(f"node {name!r}: online_after must be a number of seconds > 0 "
                             f"(or None: never), got {online_after!r}")
        online_after = float(online_after)
    if batch_api and (streaming or batch_size is not None):
        raise ValueError(f"node {name!r}: a batch_api=True node is called once per item and "
                         "returns one value (no streaming, no batch_size); its provider calls "
                         "are batched for it")
    return batch_api, online_after


def _scalars(name: str, scalars: str | Iterable[str], params: tuple[str, ...]
             ) -> tuple[str, ...]:
    """The parameters a batch node's calls receive as one value, not a list (each a
    parameter of the node)."""
    names = (scalars,) if isinstance(scalars, str) else tuple(scalars)
    for p in names:
        if not isinstance(p, str) or p not in params:
            raise ValueError(
                f"node {name!r}: scalars names {p!r}, which is not one of its parameters "
                f"({', '.join(params) or 'none'}); list parameter names in scalars=")
    return names


def _by_reference(func: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """Let a module-level node function pickle by reference. ``@node`` puts the node, not
    the function, under the function's name in its module, so pickle (and cloudpickle)
    could not find the function there and shipped it by value, with every global it reads
    (a module-level client: unpicklable, or a copy per task). Its qualified name becomes
    ``name.func``, which resolves to the function through the node: worker processes import
    the module and use its own globals. Anything else (``__main__``, closures) is unchanged
    and still pickles by value."""
    if (isinstance(func, types.FunctionType) and func.__module__ not in (None, "__main__")
            and func.__qualname__ == func.__name__):
        func.__qualname__ = f"{func.__name__}.func"
    return func


class FunctionNode(HyperNode):
    """A plain function node made by ``@node``."""

    kind: NodeKind = "function"


class BranchNode(HyperNode):
    """A bool-returning routing node: activates ``when_true`` or ``when_false``."""

    kind: NodeKind = "branch"

    def __init__(self, *, when_true: str, when_false: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if when_true == when_false:
            raise ValueError(f"branch {self.name!r}: when_true and when_false are both {when_true!r}")
        self.when_true = when_true
        self.when_false = when_false

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.when_true, self.when_false)


class GateNode(HyperNode):
    """A multi-way routing node returning one target name (or ``END``)."""

    kind: NodeKind = "gate"

    def __init__(self, *, choices: Sequence[str], descriptions: dict[str, str], **kwargs: Any):
        super().__init__(**kwargs)
        if not choices:
            raise ValueError(
                f"gate {self.name!r} declares no targets: annotate its return type with "
                "Literal['a', 'b', END] or pass gate(targets=[...])"
            )
        self.choices = tuple(choices)
        self.descriptions = dict(descriptions)

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(c for c in self.choices if c is not END and c != END)

    @property
    def can_end(self) -> bool:
        return END in self.choices


class InterruptNode(HyperNode):
    """A pause point: surfaces ``input_param`` and waits for a value for ``response_param``."""

    kind: NodeKind = "interrupt"

    def __init__(
        self,
        name: str,
        input_param: str,
        response_param: str,
        response_type: type | None = None,
        tags: Iterable[str] = (),
    ) -> None:
        super().__init__(
            name=name,
            params=(input_param,),
            defaults={},
            outputs=(response_param,),
            func=None,
            tags=tags,
            cache=False,
        )
        self.input_param = input_param
        self.response_param = response_param
        self.response_type = response_type


# ----------------------------------------------------------------------------- signatures

_STREAMS = {"Iterator", "Iterable", "Generator", "AsyncIterator", "AsyncIterable", "AsyncGenerator"}


def _stream_kind(func: Callable[..., Any]) -> type:
    """What a stream of ``func`` joins into, read from its return annotation: ``str``,
    ``bytes`` or ``dict`` (``-> str``, ``-> Iterator[str]``, ``AsyncIterator[bytes]``...);
    ``list`` otherwise (also when the annotation cannot be resolved)."""
    try:
        annotation = typing.get_type_hints(func).get("return")
    except Exception:
        return list
    origin = typing.get_origin(annotation)
    if origin is not None and getattr(origin, "__name__", "") in _STREAMS:
        args = typing.get_args(annotation)
        annotation = args[0] if args else None
        origin = typing.get_origin(annotation)
    kind = origin or annotation
    for known in (str, bytes, dict):
        if isinstance(kind, type) and issubclass(kind, known):
            return known
    return list



def _signature(func: Callable[..., Any], name: str) -> tuple[tuple[str, ...], dict[str, Any]]:
    """Parameter names and defaults of ``func``; variadic parameters are rejected."""
    if not callable(func):
        raise TypeError(f"node {name!r}: expected a callable, got {type(func).__name__}")
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"node {name!r}: cannot read the signature of {func!r}") from exc
    params: list[str] = []
    defaults: dict[str, Any] = {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(
                f"node {name!r}: parameter {p.name!r} is variadic; graph nodes need named parameters"
            )
        if p.kind is p.POSITIONAL_ONLY:
            raise ValueError(
                f"node {name!r}: parameter {p.name!r} is positional-only; graph inputs are wired by name"
            )
        params.append(p.name)
        if p.default is not p.empty:
            defaults[p.name] = p.default
    return tuple(params), defaults


def _outputs(output_name: str | Sequence[str] | None, name: str) -> tuple[str, ...]:
    if output_name is None:
        return ()
    if isinstance(output_name, str):
        return (output_name,)
    outs = tuple(output_name)
    if not outs or not all(isinstance(o, str) and o for o in outs):
        raise ValueError(f"node {name!r}: output_name must be a string or a tuple of strings")
    if len(set(outs)) != len(outs):
        raise ValueError(f"node {name!r}: output_name {outs} repeats a name")
    return outs


def _function_of(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f``, or the function of node ``f`` (re-decorating a node re-wraps its function)."""
    if not isinstance(f, HyperNode):
        return f
    if f.func is None:
        raise TypeError(f"@node cannot wrap {f.name!r}: it calls no function")
    return f.func


def _func_name(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


# ----------------------------------------------------------------------------- decorators


def node(
    func: Callable[..., Any] | None = None,
    *,
    output_name: str | Sequence[str] | None = None,
    name: str | None = None,
    tags: Iterable[str] = (),
    cache: bool = True,
    streaming: bool = False,
    retries: int = 0,
    backoff: Any = None,
    timeout: float | None = None,
    version: str | None = None,
    concurrency: int | None = None,
    rate_limit: Any = None,
    retry_on: Any = Exception,
    batch_size: int | None = None,
    scalars: str | Sequence[str] = (),
    max_retry_after: float = MAX_RETRY_AFTER,
    batch_api: bool = False,
    online_after: float | None = None,
) -> Any:
    """Make a function a graph node writing ``output_name`` (a tuple return is unpacked).

    Call policies (``hypernodes_dist.policies``): ``retries`` re-runs a failed call up to N
    more times, waiting ``backoff`` (``None``, seconds, ``"exponential"`` or
    ``callable(attempt) -> seconds``) between attempts, for the errors ``retry_on`` lists
    (an exception class or a tuple; others fail at once); ``timeout`` seconds per attempt;
    ``concurrency`` caps overlapping calls and ``rate_limit`` (``"100/minute"`` or
    ``(count, seconds)``) spaces call starts, across all processes of the machine (and of a
    Dask ``distributed`` cluster). A provider's ``Retry-After`` longer than
    ``max_retry_after`` seconds (default 3600), or not a number or an HTTP date, is ignored
    (the back-off applies).

    ``batch_size=N``: a batch node. Each call receives, for every parameter that is not a
    resource, a list of up to N items' values (item order) and returns one value per item
    (a list; a tuple of lists for several outputs); cache, errors and events stay per item,
    policies apply per call (``hypernodes_dist.execution.batching``). ``scalars=("model",)``:
    those parameters get one value per call, not a list; items whose values of them differ
    go to different calls (``ValueError`` here if one is not a parameter).

    ``batch_api=True``: the calls of ``openai``/``anthropic`` clients the node receives from
    ``@resource``s go through the provider's Batch API (half price, answered within 24 h);
    the node's code is unchanged. ``online_after=S``: a batch still running S seconds after
    its submission is cancelled and its unanswered requests are sent online.
    """

    def wrap(f: Callable[..., Any]) -> FunctionNode:
        f = _function_of(f)
        node_name = name or _func_name(f)
        return _build(
            FunctionNode, f, node_name,
            outputs=_outputs(output_name, node_name), tags=tags, cache=cache,
            streaming=streaming, retries=retries, backoff=backoff, timeout=timeout,
            version=version, concurrency=concurrency, rate_limit=rate_limit, retry_on=retry_on,
            batch_size=batch_size, scalars=scalars, max_retry_after=max_retry_after,
            batch_api=batch_api, online_after=online_after,
        )

    return wrap(func) if func is not None else wrap


def branch(
    func: Callable[..., Any] | None = None,
    *,
    when_true: str,
    when_false: str,
    name: str | None = None,
    tags: Iterable[str] = (),
    cache: bool = False,
) -> Any:
    """Make a bool-returning function a routing node between two target node names."""

    def wrap(f: Callable[..., Any]) -> BranchNode:
        return _build(BranchNode, f, name or _func_name(f), outputs=(), tags=tags, cache=cache,
                      when_true=when_true, when_false=when_false)

    return wrap(func) if func is not None else wrap


def gate(
    func: Callable[..., Any] | None = None,
    *,
    targets: Sequence[str | tuple[str, str]] | None = None,
    name: str | None = None,
    tags: Iterable[str] = (),
    cache: bool = False,
) -> Any:
    """Make a function a multi-way routing node; its targets come from ``Literal[...]``."""
    caller_locals = dict(sys._getframe(1).f_locals)  # resolves local Literal aliases

    def wrap(f: Callable[..., Any]) -> GateNode:
        node_name = name or _func_name(f)
        entries = (
            list(targets) if targets is not None else _literal_targets(f, node_name, caller_locals)
        )
        choices, descriptions = _parse_choices(entries, node_name)
        return _build(GateNode, f, node_name, outputs=(), tags=tags, cache=cache,
                      choices=choices, descriptions=descriptions)

    return wrap(func) if func is not None else wrap


def _build(cls: type[N], func: Callable[..., Any], name: str, **fields: Any) -> N:
    """A node of class ``cls`` around ``func``: signature read, metadata copied."""
    params, defaults = _signature(func, name)
    built = cls(name=name, params=params, defaults=defaults, func=func, **fields)
    _copy_metadata(built, func)
    return built


def _copy_metadata(built: HyperNode, func: Callable[..., Any]) -> None:
    for attr in ("__module__", "__qualname__", "__doc__", "__name__"):
        value = getattr(func, attr, None)
        if value is not None:
            try:
                setattr(built, attr, value)
            except (AttributeError, TypeError):
                pass
    built.__wrapped__ = func  # type: ignore[attr-defined]  # __wrapped__ for inspect.unwrap, as functools.wraps sets it


def _literal_targets(func: Callable[..., Any], name: str, localns: dict[str, Any]) -> list[Any]:
    annotation = inspect.signature(func).return_annotation
    if isinstance(annotation, str) or annotation is inspect.Signature.empty:
        try:
            annotation = typing.get_type_hints(func, localns=localns).get("return", annotation)
        except Exception as exc:  # unresolvable forward reference
            raise ValueError(f"gate {name!r}: cannot resolve its return annotation: {exc}") from exc
    if typing.get_origin(annotation) is not Literal:
        raise ValueError(
            f"gate {name!r}: the return annotation must be Literal[...] of target names "
            f"(or pass gate(targets=[...])), got {annotation!r}"
        )
    return list(typing.get_args(annotation))


def _parse_choices(entries: list[Any], name: str) -> tuple[list[str], dict[str, str]]:
    choices: list[str] = []
    descriptions: dict[str, str] = {}
    for entry in entries:
        if isinstance(entry, tuple) and len(entry) == 2 and all(isinstance(e, str) for e in entry):
            target, description = entry
            descriptions[target] = description
        elif isinstance(entry, str):
            target = entry
        else:
            raise ValueError(
                f"gate {name!r}: target entries must be names or (name, description), got {entry!r}"
            )
        choices.append(END if target == END else target)
    return choices, descriptions
