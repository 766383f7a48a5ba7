"""Exception types and the helpers that attach node/item context to user errors."""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "GraphBuildError",
    "call_portably",
    "DuplicateNodeError",
    "UnknownTargetError",
    "AmbiguousProducerError",
    "InvalidCycleError",
    "GraphInputError",
    "MaxIterationsError",
    "GateDecisionError",
    "BatchLengthError",
    "BudgetExceededError",
    "WindowLimitError",
    "WaitingForBatch",
    "MapStoppedWarning",
    "NodeError",
    "EngineNotFoundError",
    "UnpicklableError",
    "ResourceError",
    "NestedPause",
    "CommandError",
    "annotate",
    "portable",
]


class CommandError(ValueError):
    """A mistake in a ``hypernodes-dist`` command line (an unknown workload or engine, a
    module that does not import): printed as one line, exit code 2, no traceback."""


class GraphBuildError(ValueError):
    """An invalid graph, raised when the ``Graph`` is built. Names the offending nodes."""

    def __init__(self, message: str, nodes: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.nodes = tuple(nodes)


class DuplicateNodeError(GraphBuildError):
    """Two nodes share one name."""


class UnknownTargetError(GraphBuildError):
    """A branch or gate names a target node that is not in the graph."""


class AmbiguousProducerError(GraphBuildError):
    """Two nodes write one output name and are not mutually exclusive."""


class InvalidCycleError(GraphBuildError):
    """A cycle that no branch or gate controls."""


class GraphInputError(ValueError):
    """Bad inputs to ``run``/``map``: missing, unknown, or of the wrong shape. Names the parameters."""

    def __init__(self, message: str, params: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.params = tuple(params)


class MaxIterationsError(RuntimeError):
    """A loop ran more than ``max_iterations`` executions of one node."""

    def __init__(self, message: str, nodes: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.nodes = tuple(nodes)


class GateDecisionError(ValueError):
    """A branch or gate returned something that is not one of its declared targets."""


class BatchLengthError(ValueError):
    """A batch node (``@node(batch_size=N)``) returned another number of values than the
    items it was called with: every item of that call fails with it."""


class NodeError(RuntimeError):
    """Carries a node failure whose original exception could not cross a process boundary."""

    def __init__(self, message: str, original_type: str = "", traceback_text: str = "") -> None:
        super().__init__(message)
        self.original_type = original_type
        self.traceback_text = traceback_text


class EngineNotFoundError(LookupError):
    """No installed engine plugin has the requested name."""


class NestedPause(BaseException):
    """An interrupt inside a nested graph paused it: the calling run pauses too. A
    ``BaseException`` so that retries and ``on_error`` never treat it as a failure."""

    def __init__(self, name: str, value: object, response_param: str) -> None:
        super().__init__(f"interrupt {name!r} is waiting for {response_param!r}")
        self.name = name
        self.value = value
        self.response_param = response_param


class UnpicklableError(TypeError):
    """A node, an input or a node's result cannot be sent between processes (every engine
    raises this one type); the message names the node, parameter or item and what to do."""


class ResourceError(RuntimeError):
    """Building a ``@resource`` failed in a worker: names the resource and the worker; the
    original error is the ``__cause__``. Every item that needs the resource fails with it."""

    def __init__(self, message: str, resource: str = "", worker: str = "") -> None:
        super().__init__(message)
        self.resource = resource
        self.worker = worker

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles with its ``__cause__`` (the build's own error) when that one pickles."""
        state: dict[str, Any] = {}
        try:
            pickle.dumps(self.__cause__)
            state["__cause__"] = self.__cause__
        except Exception:  # noqa: S110 - the message names the cause already
            pass
        return (type(self), (str(self), self.resource, self.worker), state)


class BudgetExceededError(RuntimeError):
    """A map's ``budget`` was reached: this item's call of ``node`` did not start (calls in
    flight finished and were kept). Rerun with a larger budget to finish the rest; with a
    cache or ``into=``, finished items are not paid again."""

    def __init__(self, message: str, quantity: str = "", spent: float = 0.0,
                 limit: float = 0.0, node: str = "") -> None:
        super().__init__(message)
        self.quantity, self.spent, self.limit, self.node = quantity, spent, limit, node

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.quantity, self.spent, self.limit, self.node),
                self.__dict__)


class WindowLimitError(ValueError):
    """A call would meter more of a quantity than its ``rate_limit`` allows in a whole window
    (``amount`` > ``limit`` per ``per`` seconds): it could never start, so it fails at once
    (not retried), naming the node, the limit and what to do."""

    def __init__(self, message: str, node: str = "", quantity: str = "", amount: float = 0.0,
                 limit: float = 0.0, per: float = 0.0) -> None:
        super().__init__(message)
        self.node, self.quantity, self.amount = node, quantity, amount
        self.limit, self.per = limit, per

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.node, self.quantity, self.amount, self.limit,
                             self.per), self.__dict__)


class WaitingForBatch(Exception):  # noqa: N818 - an item's outcome, not a failure
    """An item's call was recorded for a provider batch (``@node(batch_api=True)``): the
    item waits for the answer. The executors keep it apart from failures (not an error,
    not cached, not written); never retried."""

    def __init__(self, node: str = "", digest: str = "") -> None:
        super().__init__(f"node {node!r} waits for a provider batch ({digest})")
        self.node, self.digest = node, digest

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.node, self.digest), self.__dict__)


class MapStoppedWarning(UserWarning):
    """A map stopped before every row was done (its budget was reached): one line naming
    what happened, how many rows are done and what to do."""


def annotate(exc: BaseException, node: str, item: int | None = None) -> BaseException:
    """Attach ``node`` (and ``item``) to ``exc`` as a note; ``hn_node``/``hn_item`` name the
    outermost context (the map item of a nested failure). Returns ``exc``."""
    where = f"in node {node!r}" if item is None else f"in node {node!r} (item {item})"
    notes = getattr(exc, "__notes__", None)
    if notes is None:
        notes = []
        try:
            exc.__notes__ = notes
        except AttributeError:
            return exc
    note = f"hypernodes: failed {where}"
    if note not in notes:  # nested graphs add the outer node and item after the inner ones
        notes.append(note)
    exc.hn_node = node  # type: ignore[attr-defined]  # hn_* annotations go on any exception instance
    exc.hn_item = item  # type: ignore[attr-defined]  # hn_* annotations go on any exception instance
    return exc


def portable(exc: BaseException) -> BaseException:
    """``exc`` itself, made to cross a process boundary as its own class with its attributes.

    An exception that pickles as it is comes back as it is. One whose class cannot be
    rebuilt from its ``args`` (``openai.BadRequestError`` takes ``response=`` and ``body=``
    keywords) pickles by state instead: its class, ``args`` and attributes (``status_code``,
    ``response`` with its status and headers, ``body``, notes). Only when even that fails (a
    class defined where the other side cannot import it, an attribute that cannot pickle
    at all) a ``NodeError`` carrying its type name and text stands in for it."""
    if _round_trips(exc):
        return exc
    state = _portable_state(exc)
    if state is not None:
        # this instance pickles by state (pickle looks __reduce_ex__ up on the instance)
        exc.__reduce_ex__ = _by_state(type(exc), exc.args, state)  # type: ignore[method-assign, assignment]  # this instance's own reducer: it pickles by state
        if _round_trips(exc):
            return exc
        del exc.__reduce_ex__
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    wrapped = NodeError(f"{type(exc).__name__}: {exc}", type(exc).__qualname__, text)
    wrapped.__notes__ = list(getattr(exc, "__notes__", []))
    for attr in ("hn_node", "hn_item"):
        if hasattr(exc, attr):
            setattr(wrapped, attr, getattr(exc, attr))
    return wrapped


def _round_trips(exc: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(exc))
        return True
    except Exception:
        return False


def _portable_state(exc: BaseException) -> dict[str, Any] | None:
    """``exc``'s attributes, each as it pickles (an HTTP response or request rebuilt without
    its stream); ``None`` when one cannot be carried."""
    state = {}
    for name, value in vars(exc).items():
        if name == "__reduce_ex__":
            continue
        try:
            pickle.dumps(value)
        except Exception:
            value = _http_replica(value)
            if value is None:
                return None
        state[name] = value
    return state


def _http_replica(value: Any) -> Any:
    """An ``httpx`` response or request as one that pickles (status, headers, body read so
    far, method and URL); ``None`` for anything else."""
    if not type(value).__module__.startswith("httpx"):
        return None
    import httpx  # only ever reached with an httpx object in hand

    if isinstance(value, httpx.Request):
        return httpx.Request(value.method, value.url, headers=value.headers)
    if isinstance(value, httpx.Response):
        body = value.content if value.is_stream_consumed or value.is_closed else b""
        try:
            request = _http_replica(value.request)
        except RuntimeError:  # a response made without a request
            request = None
        return httpx.Response(value.status_code, headers=value.headers, content=body,
                              request=request)
    return None


def _by_state(cls: type[BaseException], args: tuple[Any, ...],
              state: dict[str, Any]) -> Callable[[int], tuple[Any, ...]]:
    def reduce(protocol: int) -> tuple[Any, ...]:
        return (_rebuild, (cls, args, state))
    return reduce


def _rebuild(cls: type[BaseException], args: tuple[Any, ...],
             state: dict[str, Any]) -> BaseException:
    """An exception of class ``cls`` with ``args`` and attributes ``state``, its own
    ``__init__`` not called (it may want more than ``args``)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    vars(exc).update(state)
    return exc


def call_portably(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker process whose errors cross a process boundary: an error is
    made ``portable`` and raised outside the handler, so no unpicklable ``__context__``
    travels with it."""
    try:
        return fn(*args)
    except Exception as exc:
        error = portable(exc)
        del exc
    raise error
