"""Known clients' ``create`` methods, their request body computed from the call's arguments.

A ``batch_api=True`` node runs its code twice per row: the record pass (the request is
recorded, ``BatchWait`` raised) and the replay pass (answered from the batch). On the record
pass the SDK's request preamble (``maybe_transform`` over its TypedDicts, the request
options, the request loop) is pure cost. For the methods in ``KNOWN`` (``openai`` chat
completions, embeddings, responses; ``anthropic`` messages, sync and async) the recording
copy's resource objects get a per-instance ``create`` that builds the body the SDK would
send straight from the keyword arguments: the given params (``NotGiven``/``Omit`` dropped),
the SDK's own defaults (openai embeddings: ``encoding_format="base64"``), ``extra_body``
merged over them as the SDK merges it. A call of plain JSON values is then looked up:
not answered, it is recorded and ``BatchWait`` raised with no SDK work at all; answered 2xx,
the SDK's return value is built from the answer as the SDK builds it (``fastreplies.py``:
no request, no response; self-checked apart, below); any other answer (or sent online), the
SDK's own ``create`` runs as before, so the client raises its own error, and the answer
found here is passed on (``take_passed``) so the request is not looked up twice. Anything else (positional
arguments, ``extra_headers``, ``extra_query``, ``timeout``, ``stream=True``, a param sent
as a header, a value that is not plain JSON, a missing or unknown argument) is the SDK's.

Self-checking: the first fast call per (client class, method, arguments given) in a process is
also built the SDK's way (its ``create`` run until the request is built, ``capturing``) and
the two canonical bodies compared; on any difference the fast path is off for that method
in this process. Likewise the first fast answer per (client class, method, arguments
given) is also made the SDK's way and compared (``fastreplies.same``); a difference
switches the fast answer off for that method. A param whose type carries a ``PropertyInfo`` alias or format below its
top level (where the SDK's rewrite depends on the value) never takes the fast path; at the
top level the check proves it.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import sys
import typing
from collections.abc import Callable, Generator, Mapping
from typing import Any, NamedTuple

from hypernodes_dist.batchapi import fastreplies
from hypernodes_dist.batchapi.fastreplies import Reply
from hypernodes_dist.batchapi.identity import Canonical, canonical_json

__all__ = ["Known", "KNOWN", "Captured", "install", "capturing", "take_passed",
           "switched_off", "took_fast_path", "answers_off", "took_fast_answer", "plain"]

_SCALARS = frozenset({str, int, float, bool, type(None)})
_CONTROLS = ("extra_headers", "extra_query", "extra_body", "timeout")
_CAPTURE: contextvars.ContextVar[bool] = contextvars.ContextVar("hn_batch_capture",
                                                                default=False)
_PASSED: contextvars.ContextVar[Any] = contextvars.ContextVar("hn_batch_passed", default=None)


def _anthropic_guard(resource: Any, kwargs: Mapping[str, Any]) -> bool:
    """``messages.create`` refuses (ValueError), before it builds a request, a non-streamed
    call that may outlast 10 minutes on the client's default timeout: refused here alike.
    False: the SDK's constants are not where they were (its way, then)."""
    module, client = sys.modules.get(type(resource).__module__), resource._client
    default = getattr(module, "DEFAULT_TIMEOUT", None)
    tokens = getattr(module, "MODEL_NONSTREAMING_TOKENS", None)
    check = getattr(client, "_calculate_nonstreaming_timeout", None)
    if default is None or tokens is None or check is None:
        return False
    if client.timeout == default:
        check(kwargs["max_tokens"], tokens.get(kwargs["model"], None))
    return True


def _anthropic_loud(resource: Any, kwargs: Mapping[str, Any]) -> bool:
    """Whether ``messages.create`` would warn of the call's model (deprecated; thinking
    "enabled" on a model that takes "adaptive"): its way then, so the user sees it. True
    too when the SDK's lists are not where they were."""
    module = sys.modules.get(type(resource).__module__)
    old = getattr(module, "DEPRECATED_MODELS", None)
    thinks = getattr(module, "MODELS_TO_WARN_WITH_THINKING_ENABLED", None)
    if old is None or thinks is None:
        return True
    model, thinking = kwargs.get("model"), kwargs.get("thinking")
    return model in old or (model in thinks and isinstance(thinking, dict)
                            and thinking.get("type") == "enabled")


class Known(NamedTuple):
    """A client method the fast path takes."""

    path: tuple[str, ...]       # the resource's attributes from the client
    module: str                 # the module of the resource classes (sync and async)
    endpoint: str               # the batch endpoint
    params: str                 # "module:TypedDict" the SDK transforms the body with, or ""
    defaults: Mapping[str, Any] = {}     # body keys the SDK sets when not given
    apart: frozenset[str] = frozenset()  # params the SDK sends elsewhere (headers)
    guard: Callable[[Any, Mapping[str, Any]], bool] | None = None  # the SDK's own refusals
    reply: Reply | None = None  # how create builds its return value (fastreplies.py)


KNOWN: tuple[Known, ...] = (
    Known(("chat", "completions"), "openai.resources.chat.completions.completions",
          "/v1/chat/completions",
          "openai.types.chat.completion_create_params:CompletionCreateParamsNonStreaming",
          reply=Reply("openai.types.chat.chat_completion:ChatCompletion")),
    Known(("embeddings",), "openai.resources.embeddings", "/v1/embeddings",
          "openai.types.embedding_create_params:EmbeddingCreateParams",
          defaults={"encoding_format": "base64"},
          reply=Reply("openai.types.create_embedding_response:CreateEmbeddingResponse",
                      post=fastreplies.embeddings_post)),
    Known(("responses",), "openai.resources.responses.responses", "/v1/responses",
          "openai.types.responses.response_create_params:ResponseCreateParamsNonStreaming",
          reply=Reply("openai.types.responses.response:Response")),
    Known(("messages",), "anthropic.resources.messages.messages", "/v1/messages", "",
          apart=frozenset({"user_profile_id", "workspace_id"}), guard=_anthropic_guard,
          reply=Reply("anthropic.types.message:Message", loud=_anthropic_loud)),
)

_VERDICTS: dict[tuple[Any, ...], bool] = {}  # (method, arguments): checked equal
_OFF: set[tuple[type, type]] = set()         # methods (client, resource class) that disagreed
_MARKS: dict[tuple[str, str], int] = {}      # (params, key): 0 none, 1 top level, 2 below
_REPLIED: set[tuple[Any, ...]] = set()       # (method, arguments): fast answer checked equal
_REPLY_OFF: set[tuple[type, type]] = set()   # methods whose fast answer disagreed


class Captured(BaseException):  # noqa: N818 - a signal, carried out of the SDK's create
    """The SDK's own build of a call, captured for the self-check: ``found`` is the
    endpoint and canonical body its request options give (None: not a batchable body)."""

    def __init__(self, found: tuple[str, Canonical] | None) -> None:
        super().__init__("captured")
        self.found = found


def capturing() -> bool:
    """Whether the request being built is the self-check's (raise ``Captured``)."""
    return _CAPTURE.get()


def take_passed() -> Any:
    """The answer the fast path looked up for the request being built (then forgotten),
    or None: look it up."""
    answer = _PASSED.get()
    if answer is not None:
        _PASSED.set(None)
    return answer


def switched_off(client_class: type, resource_class: type) -> bool:
    """Whether the self-check switched the fast path off for the ``create`` of
    ``resource_class`` (``chat.completions``...) of ``client_class``'s clients."""
    return (client_class, resource_class) in _OFF


def answers_off(client_class: type, resource_class: type) -> bool:
    """Whether the self-check switched the fast answer off for that method (the SDK builds
    its return value from the answer, through its request and response)."""
    return (client_class, resource_class) in _REPLY_OFF


def took_fast_answer(client_class: type, resource_class: type) -> bool:
    """Whether an answered call of that method was built without the SDK's request and
    response in this process (its self-check passed, and it is not switched off)."""
    method = (client_class, resource_class)
    return method not in _REPLY_OFF and any(k[0] == method for k in _REPLIED)


def took_fast_path(client_class: type, resource_class: type) -> bool:
    """Whether a call of that method took the fast path in this process (its self-check
    passed, and it is not switched off)."""
    method = (client_class, resource_class)
    return method not in _OFF and any(k[0] == method for k in _VERDICTS)


def plain(value: Any) -> bool:
    """Whether ``value`` holds only dicts with string keys, lists and JSON scalars: then its
    canonical bytes equal those of the JSON the client sends, parsed (an int key would sort
    apart from its string; a datetime, a model, a dict subclass are the client's to encode)."""
    kind = type(value)
    if kind is dict:
        return _plain_fields(value)
    if kind is list or kind is tuple:
        for v in value:
            if type(v) not in _SCALARS and not plain(v):
                return False
        return True
    return kind in _SCALARS


def _plain_fields(body: Mapping[Any, Any]) -> bool:
    """``plain`` of a dict's keys and values (of a ``Canonical`` being built, too)."""
    for k, v in body.items():
        if type(k) is not str or (type(v) not in _SCALARS and not plain(v)):
            return False
    return True


def _rewrites(meta: object) -> bool:
    """A ``PropertyInfo`` that renames a key or reformats a value (not a discriminator)."""
    return type(meta).__name__ == "PropertyInfo" and (
        getattr(meta, "alias", None) is not None or getattr(meta, "format", None) is not None)


def _rewritten(tp: Any, seen: set[Any]) -> bool:
    """Whether a rewriting ``PropertyInfo`` is anywhere in the type ``tp``."""
    if typing.get_origin(tp) is typing.Annotated:
        return any(_rewrites(m) for m in tp.__metadata__) or _rewritten(tp.__origin__, seen)
    if isinstance(tp, type) and hasattr(tp, "__total__") and hasattr(tp, "__annotations__"):
        if tp in seen:  # a TypedDict, once
            return False
        seen.add(tp)
        hints = typing.get_type_hints(tp, include_extras=True)
        return any(_rewritten(h, seen) for h in hints.values())
    return any(_rewritten(a, seen) for a in typing.get_args(tp))


def _marks_of(params: str, key: str) -> int:
    """0: the SDK sends ``key``'s plain value as it is; 1: a rewrite at its top level (the
    self-check proves it); 2: one below it, or its type unreadable (the SDK's way)."""
    if not params:
        return 0
    module, _, name = params.partition(":")
    try:
        hints = typing.get_type_hints(getattr(importlib.import_module(module), name),
                                      include_extras=True)
        hint: Any = hints.get(key)
        if hint is None:  # a key the type does not name: sent as it is
            return 0
        while getattr(typing.get_origin(hint), "_name", "") in ("Required", "NotRequired",
                                                                  "ReadOnly"):
            hint = typing.get_args(hint)[0]
        top = typing.get_origin(hint) is typing.Annotated and any(
            _rewrites(m) for m in hint.__metadata__)
        inner = hint.__origin__ if typing.get_origin(hint) is typing.Annotated else hint
        return 2 if _rewritten(inner, set()) else int(top)
    except Exception:  # a type the SDK itself may not read: its way
        return 2


def _mark(params: str, key: str) -> int:
    found = _MARKS.get((params, key))
    if found is None:
        found = _MARKS[(params, key)] = _marks_of(params, key)
    return found


class _Found(NamedTuple):
    key: tuple[Any, ...]   # what the self-check's verdict is kept by
    endpoint: str
    body: Canonical


class _Shape(NamedTuple):
    """What a call's argument names say, read once per method and names."""

    params: tuple[str, ...]    # the body's params given
    controls: tuple[str, ...]  # extra_headers, extra_query, timeout given (None/absent only)
    extra: bool                # extra_body given
    refused: frozenset[str]    # given params that, not absent, are the SDK's way (apart, mark 2)
    key: tuple[Any, ...]       # the verdict's key when every param is sent, no extra_body


_UNSEEN = _Shape((), (), False, frozenset(), ())
_SHAPES_MAX = 256  # argument names kept per method (a call site has one)


class FastCreate:
    """One resource object's fast ``create``: the body from the arguments, the self-check's
    verdict, the lookup (``transport.lookup``: ``BatchWait`` when not answered)."""

    def __init__(self, known: Known, resource: Any, transport: Any,
                 absent: tuple[type, ...], signature: inspect.Signature) -> None:
        self.known, self.resource, self.transport, self.absent = known, resource, transport, absent
        # what a verdict is for: this client class's method
        self.method = (type(getattr(resource, "_client", None)), type(resource))
        names = [p.name for p in signature.parameters.values() if p.name not in _CONTROLS]
        self.params = frozenset(names) - {"self"}
        self.required = frozenset(p.name for p in signature.parameters.values()
                                  if p.default is inspect.Parameter.empty and p.name != "self")
        self.shapes: dict[tuple[str, ...], _Shape | None] = {}
        self.replier = fastreplies.replier(known.reply, resource)

    def shape(self, names: tuple[str, ...]) -> _Shape | None:
        """What the argument names say (None: the SDK's way: a required one missing, one
        unknown), read once per names."""
        shape = self.shapes.get(names, _UNSEEN)
        if shape is _UNSEEN:
            shape = self._read(names)
            if len(self.shapes) < _SHAPES_MAX:
                self.shapes[names] = shape
        return shape

    def _read(self, names: tuple[str, ...]) -> _Shape | None:
        if not self.required.issubset(names):
            return None
        params: list[str] = []
        controls: list[str] = []
        for name in names:
            if name in self.params:
                params.append(name)
            elif name in _CONTROLS:
                controls.append(name)
            else:
                return None  # unknown
        known = self.known
        return _Shape(tuple(params), tuple(c for c in controls if c != "extra_body"),
                      "extra_body" in controls,
                      frozenset(n for n in params if n in known.apart
                                or _mark(known.params, n) == 2),
                      (self.method, frozenset(params), None))

    def found(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Found | None:
        """The call's endpoint and body, or None: the SDK's way."""
        if args or (_OFF and self.method in _OFF):
            return None
        names = tuple(kwargs)
        shape = self.shapes.get(names, _UNSEEN)  # ``shape``, its call inlined
        if shape is _UNSEEN:
            shape = self.shape(names)
        if shape is None:
            return None
        # the body is built as the Canonical it is handed on as (no copy)
        body, absent = dict.__new__(Canonical), self.absent
        for name in shape.params:  # str keys: plain values (``plain``) or absent ones only
            value = kwargs[name]
            kind = type(value)
            if kind in _SCALARS:
                body[name] = value
            elif kind not in absent:
                if not plain(value):
                    return None
                body[name] = value
        for name in shape.controls:  # extra_headers / extra_query / timeout given
            value = kwargs[name]
            if value is not None and type(value) not in absent:
                return None
        extra = kwargs["extra_body"] if shape.extra else None
        if (extra is not None and type(extra) is not dict) or (
                shape.refused and not shape.refused.isdisjoint(body)):
            return None
        key = shape.key if extra is None and len(body) == len(shape.params) else (
            self.method, frozenset(body), None if extra is None else frozenset(extra))
        known = self.known
        if known.defaults:
            body.update((k, v) for k, v in known.defaults.items() if k not in body)
        if extra is not None:
            body = Canonical({k: v for k, v in {**body, **extra}.items()
                              if type(v) not in absent}, b"")
        # streamed: the SDK's way; the params were checked plain above, the defaults are
        # plain strings, extra_body's values are checked here
        if body.get("stream") or (extra is not None and not _plain_fields(body)) or (
                known.guard is not None and not known.guard(self.resource, kwargs)):
            return None
        try:
            body.canonical = canonical_json(body)
        except ValueError:  # NaN, a lone surrogate: as the client fails it
            return None
        body.named = None
        return _Found(key, known.endpoint, body)

    def judged(self, found: _Found, sdk: tuple[str, Canonical] | None) -> _Found | None:
        """The self-check: ``found`` if the SDK's own build ``sdk`` is the same request;
        otherwise the fast path is off for this method in this process (None)."""
        if sdk is not None and sdk[0] == found.endpoint \
                and sdk[1].canonical == found.body.canonical:
            _VERDICTS[found.key] = True
            return found
        _OFF.add(self.method)
        return None

    def answer_of(self, found: _Found) -> Any:
        """The call's answer (``ONLINE``: send it), passed on (``_PASSED``) to the request
        the SDK builds; ``BatchWait`` here once the call is recorded."""
        return self.transport.lookup(found.endpoint, found.body)

    def replied(self, answer: Any, kwargs: Mapping[str, Any]) -> tuple[Any] | None:
        """The call's return value built from its 2xx ``answer`` without the SDK's request
        and response (``fastreplies.py``; ``in_batch_api()`` then True), or None: the SDK's
        way (another status, sent online, its fast answer off, a call it would warn of)."""
        replier = self.replier
        if replier is None or not 200 <= answer.status < 300 or self.method in _REPLY_OFF \
                or not replier.takes(kwargs):
            return None
        try:
            value = replier.build(answer.body, kwargs)
        except Exception:  # noqa: BLE001 - the SDK's way raises its own error, if any
            return None
        if value is None:
            return None
        self.transport.answered()
        return (value,)

    def checked(self, found: _Found, fast: Any, sdk: Any) -> Any:
        """The fast answer's self-check: ``sdk`` (the SDK's own value) is returned; the
        fast answer is off for this method in this process unless ``fast`` is the same."""
        replier = self.replier
        if replier is not None and fastreplies.same(fast, sdk, replier.model):
            _REPLIED.add(found.key)
        else:
            _REPLY_OFF.add(self.method)
        return sdk


class _Capture:
    """While in it, the SDK's request build raises ``Captured``: kept as ``found``."""

    found: tuple[str, Canonical] | None = None

    def __enter__(self) -> _Capture:
        self.token = _CAPTURE.set(True)
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        _CAPTURE.reset(self.token)
        if isinstance(exc, Captured):
            self.found = exc.found
            return True
        return False


def _steps(fast: FastCreate, args: tuple[Any, ...], kwargs: dict[str, Any],
           found: _Found | None) -> Generator[tuple[tuple[Any, ...], dict[str, Any]], Any, Any]:
    """A fast ``create``'s steps (of a call not judged yet, or not on the fast path), the
    same for sync and async clients: each ``yield`` asks the driver to run the SDK's own
    ``create`` with the yielded arguments and gets its value back (or its exception thrown
    in); the return value is the call's. ``found``: the call's ``FastCreate.found``."""
    if found is not None and found.key not in _VERDICTS:
        with _Capture() as capture:
            yield (), kwargs
        found = fast.judged(found, capture.found)
    if found is None:
        return (yield args, kwargs)
    answer = fast.answer_of(found)
    replied = fast.replied(answer, kwargs)
    if replied is not None and found.key in _REPLIED:
        return replied[0]
    return (yield from _passing(fast, found, answer, replied, kwargs))


def _passing(fast: FastCreate, found: _Found, answer: Any, replied: tuple[Any] | None,
             kwargs: dict[str, Any]) -> Generator[tuple[tuple[Any, ...], dict[str, Any]], Any, Any]:
    """The SDK's own ``create`` with the answer looked up passed on (``take_passed``); a
    fast answer made beside it is checked against its value (``FastCreate.checked``)."""
    token = _PASSED.set(answer)
    try:
        made = yield (), kwargs
    finally:
        _PASSED.reset(token)
    return made if replied is None else fast.checked(found, replied[0], made)


def _start(fast: FastCreate, args: tuple[Any, ...], kwargs: dict[str, Any]
           ) -> tuple[Any, _Run | None]:
    """A fast ``create``'s first steps: ``(value, None)`` for a call answered the fast way
    (``BatchWait`` raised for one recorded), with no generator, once its method and
    arguments are judged (most calls); else ``(None, run)``: the steps left to drive."""
    found = fast.found(args, kwargs)
    if found is None or found.key not in _VERDICTS:
        return None, _Run(_steps(fast, args, kwargs, found))
    answer = fast.answer_of(found)
    replied = fast.replied(answer, kwargs)
    if replied is not None and found.key in _REPLIED:
        return replied[0], None
    return None, _Run(_passing(fast, found, answer, replied, kwargs))


class _Run:
    """One call's steps (``_steps``, ``_passing``) driven: ``next`` gives the SDK call the
    steps ask for, or None once they returned (their value in ``value``)."""

    __slots__ = ("steps", "value")

    def __init__(self, steps: Generator[tuple[tuple[Any, ...], dict[str, Any]], Any, Any]
                 ) -> None:
        self.steps, self.value = steps, None

    def next(self, made: Any = None, exc: BaseException | None = None
             ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        try:
            return self.steps.send(made) if exc is None else self.steps.throw(exc)
        except StopIteration as done:
            self.value = done.value
            return None

    def after(self, sdk: Callable[..., Any], call: tuple[tuple[Any, ...], dict[str, Any]]
              ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        try:
            made = sdk(*call[0], **call[1])
        except BaseException as exc:  # noqa: BLE001 - the steps' to handle or raise
            return self.next(exc=exc)
        return self.next(made)

    async def after_async(self, sdk: Callable[..., Any],
                          call: tuple[tuple[Any, ...], dict[str, Any]]
                          ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        try:
            made = await sdk(*call[0], **call[1])
        except BaseException as exc:  # noqa: BLE001 - the steps' to handle or raise
            return self.next(exc=exc)
        return self.next(made)


def _sync_create(fast: FastCreate, sdk: Callable[..., Any]) -> Callable[..., Any]:
    def create(*args: Any, **kwargs: Any) -> Any:
        value, run = _start(fast, args, kwargs)
        if run is None:
            return value
        call = run.next()
        while call is not None:
            call = run.after(sdk, call)
        return run.value
    return create


def _async_create(fast: FastCreate, sdk: Callable[..., Any]) -> Callable[..., Any]:
    async def create(*args: Any, **kwargs: Any) -> Any:  # _sync_create, the SDK awaited
        value, run = _start(fast, args, kwargs)
        if run is None:
            return value
        call = run.next()
        while call is not None:
            call = await run.after_async(sdk, call)
        return run.value
    return create


def _fast_create(known: Known, resource: Any, transport: Any) -> FastCreate | None:
    """The fast path of ``resource.create``, if it is the SDK's method we know."""
    cls = type(resource)
    types_ = sys.modules.get(known.module.split(".")[0] + "._types")
    absent = tuple(t for t in (getattr(types_, "NotGiven", None), getattr(types_, "Omit", None))
                   if isinstance(t, type))
    create = getattr(cls, "create", None)
    if cls.__module__ != known.module or len(absent) != 2 or create is None:
        return None
    signature = inspect.signature(create)
    kinds = {p.kind for n, p in signature.parameters.items() if n != "self"}
    if kinds != {inspect.Parameter.KEYWORD_ONLY} or not set(_CONTROLS) <= set(
            signature.parameters):
        return None
    return FastCreate(known, resource, transport, absent, signature)


def install(client: Any, transport: Any, known_ones: tuple[Known, ...] | None = None
            ) -> tuple[Known, ...]:
    """Give ``client``'s resources of ``KNOWN`` their fast ``create`` (a recording copy
    whose ``_build_request`` raises ``Captured`` while ``capturing()`` and takes the
    ``take_passed()`` answer). A resource the client makes on first use from a module not
    imported yet (``openai``'s ``responses``: its import costs ~0.07 CPU s a process and
    the collections it sets off) is not made here: returned, to ``install`` once the module
    is imported (the client's first call of one; ``_BuildLookup``)."""
    package = type(client).__module__.split(".")[0]
    is_async = inspect.iscoroutinefunction(getattr(type(client), "post", None))
    later = []
    for known in KNOWN if known_ones is None else known_ones:
        if known.module.split(".")[0] != package:
            continue
        if _unmade(client, known):
            later.append(known)
            continue
        resource: Any = client
        for name in known.path:
            resource = getattr(resource, name, None)
        fast = None if resource is None or "create" in vars(resource) else _fast_create(
            known, resource, transport)  # (a create set on it: installed already)
        if fast is not None:  # an async client's create may not be a coroutine function
            wrap = _async_create if is_async else _sync_create
            resource.create = wrap(fast, resource.create)
    return tuple(later)


def _unmade(client: Any, known: Known) -> bool:
    """Whether ``known``'s resource is made on its first use (a ``cached_property`` of the
    client) and its module is not imported yet."""
    first = known.path[0]
    lazy = isinstance(getattr(type(client), first, None), functools.cached_property)
    return lazy and first not in vars(client) and known.module not in sys.modules
