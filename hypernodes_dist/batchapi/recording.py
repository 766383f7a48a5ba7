"""Recording and replaying a provider client's calls at its HTTP layer.

In a ``batch_api=True`` node the user's client is swapped for a copy whose HTTP transport
never reaches the network: a call the Batch API carries (``POST`` to chat completions,
embeddings, responses; Anthropic messages) is looked up by its identity (endpoint +
canonical body, exactly the bytes the client sends: openai adds
``encoding_format="base64"`` to embeddings). Answered: the stored line (status + body)
becomes the HTTP response, so the client builds its own response type (``ChatCompletion``,
``Message``...) or raises its own error (``openai.BadRequestError``) itself. Not answered:
the request is handed to ``record`` and ``BatchWait`` is raised, so the item waits.
Marked ``ONLINE`` (a batch cancelled by ``online_after``): it goes out through the original
client's HTTP client, as online.

A stainless client we know (``openai``, ``anthropic``: their base client's own
``_build_request``) is looked up earlier, as it builds the request (``_BuildLookup``): its
options' ``json_data`` merged with ``extra_json`` is the body it sends, so a recorded call
builds no request at all (no headers, no ``httpx`` request, no JSON encoded and parsed
again), and an answered one carries its answer to the transport. A call outside that
path (raw response, stream, another endpoint, a body that is not plain JSON) is read at
the HTTP layer as above. An answered call's request is then a bare ``POST`` (no headers,
no body: only its answer is read; the client's error keeps the request it would send), and
its response is handed to the client's own processing without the HTTP client's send.

Both signals derive from ``BaseException``: the clients retry (and wrap) ``Exception``
raised by a transport, and a node's ``except Exception`` must not swallow a wait. The call
layer catches them: ``BatchWait`` makes the item wait, ``UnbatchableCall.error()`` fails
it (a streamed call, ``with_raw_response``, an endpoint no Batch API carries), and so does
``BudgetRefusal.error()`` (``BudgetExceededError``: the map's budget kept the request out of
every batch).
"""

from __future__ import annotations

import contextvars
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, NamedTuple, Protocol

from hypernodes_dist.batchapi import fastcalls
from hypernodes_dist.batchapi.identity import Canonical, canonical_body, digest_for
from hypernodes_dist.batchapi.replayhttp import Replayed
from hypernodes_dist.errors import BudgetExceededError
from hypernodes_dist.perprocess import Memo

__all__ = ["Answer", "ONLINE", "REFUSED", "BudgetRefusal", "refusal_answer", "AnswerLookup", "BatchWait", "UnbatchableCall", "RecordingTransport",
           "recording_client", "batch_endpoint", "in_batch_api",
           "answered_scope", "unanswered", "restore_answered"]

# the endpoints the providers batch, by the end of the path the client posts to
_ENDPOINTS = {"/chat/completions": "/v1/chat/completions", "/embeddings": "/v1/embeddings",
              "/responses": "/v1/responses", "/messages": "/v1/messages"}
_RAW = "x-stainless-raw-response"
_ANSWERED: contextvars.ContextVar[bool] = contextvars.ContextVar("hn_batch_answered",
                                                                 default=False)


def unanswered() -> contextvars.Token[bool]:
    """``answered_scope``'s entry without its object (a hot call's); ``restore_answered``
    with the token is its exit. Module functions: a call closing over them pickles (by
    reference), one closing over the ContextVar does not."""
    return _ANSWERED.set(False)


def restore_answered(token: contextvars.Token[bool]) -> None:
    """``answered_scope``'s exit for ``unanswered``'s token."""
    _ANSWERED.reset(token)


class Answer(NamedTuple):
    """A provider's answer to one line: the HTTP status and the response body."""

    status: int
    body: Any


ONLINE = Answer(0, None)  # the stored "answer" of a request sent online (``online_after``)


class AnswerLookup(Protocol):
    """Where answers are read: ``get(digest)`` (``identity.request_digest``) or None; a
    store may also offer ``raw(digest)``: the same with the body as its JSON bytes."""

    def get(self, digest: str) -> Answer | None: ...


Record = Callable[[str, Mapping[str, Any]], None]


class BatchWait(BaseException):  # noqa: N818 - a signal, not an error
    """The call was recorded for a batch: its item waits for the answer."""

    def __init__(self, endpoint: str, digest: str) -> None:
        super().__init__(f"{endpoint} {digest} waits for a batch")
        self.endpoint, self.digest = endpoint, digest


class UnbatchableCall(BaseException):  # noqa: N818 - turned into the item's error
    """A call no Batch API carries, made in a ``batch_api=True`` node."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what

    def error(self, where: str = "") -> ValueError:
        """The item's error (``where``: the node, for the message)."""
        return ValueError(f"{where + ': ' if where else ''}{self.what} cannot go through a "
                          "provider Batch API; call it the batched way (no stream=True, no "
                          "with_raw_response; chat completions, embeddings, responses, "
                          "messages) or set batch_api=False on the node")


REFUSED = -1  # the status of a request the map's budget kept out of every batch


class BudgetRefusal(BaseException):  # noqa: N818 - turned into the item's error
    """The map's budget kept this request out of the batches (``body``: the refusal's
    ``message``, ``quantity``, ``spent``, ``limit``, ``node``)."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        super().__init__(str(body.get("message", "")))
        self.body = dict(body)

    def error(self) -> BudgetExceededError:
        """The item's error, as online."""
        b = self.body
        return BudgetExceededError(str(b.get("message", "")), str(b.get("quantity", "")),
                                   float(b.get("spent", 0.0)), float(b.get("limit", 0.0)),
                                   str(b.get("node", "")))


def refusal_answer(exc: BudgetExceededError) -> Answer:
    """How a budget refusal is stored (``BudgetRefusal`` when a worker reads it)."""
    return Answer(REFUSED, {"message": str(exc), "quantity": exc.quantity, "spent": exc.spent,
                            "limit": exc.limit, "node": exc.node})


def in_batch_api() -> bool:
    """True in a node's code once a call of it has been answered by a batch."""
    return _ANSWERED.get()


class answered_scope:  # noqa: N801 - used as a context manager
    """Resets ``in_batch_api()`` to False for one run of a node's code."""

    def __enter__(self) -> answered_scope:
        self._token = _ANSWERED.set(False)
        return self

    def __exit__(self, *exc: object) -> None:
        _ANSWERED.reset(self._token)


def _endpoint_of(path: str) -> str | None:
    """The batch endpoint a client's path posts to (its end), or None: no Batch API."""
    return next((e for end, e in _ENDPOINTS.items() if path.endswith(end)), None)


def batch_endpoint(request: Any) -> tuple[str, dict[str, Any]]:
    """The batch endpoint and JSON body of an HTTP request (``httpx``/``httpx2``), or
    ``UnbatchableCall`` naming it."""
    path = request.url.path.rstrip("/")
    what = f"{request.method} {path}"
    if request.headers.get(_RAW, "").lower() == "true":
        raise UnbatchableCall(f"{what} with with_raw_response")
    endpoint = _endpoint_of(path)
    if request.method != "POST" or endpoint is None:
        raise UnbatchableCall(what)
    try:
        body = json.loads(request.content or b"{}")
    except ValueError as exc:
        raise UnbatchableCall(f"{what} with a body that is not JSON") from exc
    if not isinstance(body, dict):
        raise UnbatchableCall(f"{what} with a body that is not a JSON object")
    if body.get("stream"):
        raise UnbatchableCall(f"{what} with stream=True")
    return endpoint, body


_LOOKED_UP = "hn_batch_answer"  # a request's extension: its answer, looked up as it was built
# options headers that change what is sent or returned: such a call is read at the HTTP layer
_HEADERS_APART = frozenset({_RAW, "____stainless_override_cast_to", "content-type"})
_OPTIONS = {"method", "url", "headers", "files", "content", "json_data", "extra_json"}


def _json(body: Any) -> Any:
    return json.loads(body) if isinstance(body, bytes) else body


class RecordingTransport:
    """An HTTP transport (sync and async) that answers from ``answers`` and records the
    rest; ``http`` is the HTTP package the client is built on (``httpx`` or ``httpx2``)."""

    def __init__(self, answers: AnswerLookup, record: Record, http: ModuleType,
                 online: Any = None) -> None:
        self.answers, self.record, self.http = answers, record, http
        # the body as JSON bytes, where the store can (``raw``)
        self.read: Callable[[str], Answer | None] = getattr(answers, "raw", None) or answers.get
        self.online = online  # the original client's HTTP client: ONLINE requests go there
        self.replayed = _replayed(http)  # answered calls' requests and responses

    def handle_request(self, request: Any) -> Any:
        request.read()
        answer = self._answer(request)
        if answer is ONLINE:
            return self.online.send(request)
        return self._response(request, answer)

    async def handle_async_request(self, request: Any) -> Any:
        await request.aread()
        answer = self._answer(request)
        if answer is ONLINE:
            return await self.online.send(request)
        return self._response(request, answer)

    def _answer(self, request: Any) -> Answer:
        answer = request.extensions.pop(_LOOKED_UP, None)  # looked up as the client built it
        if answer is not None:
            return answer
        endpoint, parsed = batch_endpoint(request)
        return self.lookup(endpoint, Canonical(parsed, canonical_body(parsed)))

    def lookup(self, endpoint: str, body: Canonical) -> Answer:
        """The answer to a request (``ONLINE``: send it), or the request recorded and
        ``BatchWait`` raised (``BudgetRefusal``: the budget kept it out)."""
        digest = digest_for(endpoint, body)
        answer = self.read(digest)
        if answer is None:
            self.record(endpoint, body)  # its canonical bytes and digest: the log reuses them
            raise BatchWait(endpoint, digest)
        if answer.status == REFUSED:
            raise BudgetRefusal(_json(answer.body))
        return ONLINE if answer.status == 0 else answer

    def answered(self) -> None:
        """A call of the node's code was answered by a batch (``in_batch_api()``)."""
        _ANSWERED.set(True)

    def _response(self, request: Any, answer: Answer) -> Any:
        _ANSWERED.set(True)
        if isinstance(answer.body, bytes):
            return self.replayed.response(answer.status, answer.body, request)
        return self.http.Response(answer.status, json=answer.body, request=request)

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def _replayed(http: ModuleType) -> Replayed:
    """The one ``Replayed`` of an HTTP package in this process."""
    return _REPLAYED.get((http.__name__,), lambda: Replayed(http))


_REPLAYED: Memo[Replayed] = Memo("batchapi.recording.replayed")


def _http_package(client: Any) -> ModuleType:
    for cls in type(getattr(client, "_client", None)).__mro__:
        top = cls.__module__.split(".")[0]
        if top.startswith("httpx"):
            return sys.modules[top]
    raise TypeError(f"{type(client).__qualname__} is not built on httpx: it cannot be "
                    "recorded for a Batch API")


def recording_client(client: Any, answers: AnswerLookup, record: Record) -> Any:
    """A copy of an ``openai``/``anthropic`` client (sync or async) whose calls are recorded
    and replayed (no retries: a batch line is answered once)."""
    http = _http_package(client)
    transport = RecordingTransport(answers, record, http, getattr(client, "_client", None))
    is_async = inspect.iscoroutinefunction(getattr(type(client), "post", None))
    http_client = (http.AsyncClient(transport=transport) if is_async
                   else http.Client(transport=transport))
    copy = client.copy(http_client=http_client, max_retries=0)
    merge = _body_merge(copy)
    if merge is not None:  # a client we know: a call is looked up as it builds its request
        copy._build_request = _BuildLookup(copy, transport, merge)
        send = getattr(type(copy), "_send_request", None)
        if send is not None and list(inspect.signature(send).parameters) == [
                "self", "request", "stream", "kwargs"]:
            copy._send_request = _answered_send(copy._send_request, transport,
                                                inspect.iscoroutinefunction(send))
        # known create methods: no SDK preamble to record (those not made yet: at first use)
        later = fastcalls.install(copy, transport)
        if later:
            copy._build_request.later = (copy, later)
    return copy


def _answered_send(send: Callable[..., Any], transport: RecordingTransport,
                   is_async: bool) -> Callable[..., Any]:
    """A known client's ``_send_request``: a request that carries its answer (a 2xx one)
    gets its response here, not through the HTTP client (auth, redirects, the transport);
    others are sent as the client sends them."""
    def answered(request: Any) -> Any:
        answer = request.extensions.get(_LOOKED_UP)
        if answer is None or answer is ONLINE or not 200 <= answer.status < 300:
            return None
        del request.extensions[_LOOKED_UP]
        return transport._response(request, answer)

    if is_async:
        async def send_async(request: Any, *, stream: bool, **kwargs: Any) -> Any:
            response = answered(request)
            return response if response is not None else await send(
                request, stream=stream, **kwargs)
        return send_async

    def send_sync(request: Any, *, stream: bool, **kwargs: Any) -> Any:
        response = answered(request)
        return response if response is not None else send(request, stream=stream, **kwargs)
    return send_sync


def _body_merge(client: Any) -> Callable[..., Any] | None:
    """The ``_merge_mappings`` its ``_build_request`` merges ``extra_body`` with, if
    ``client`` is a stainless client (``openai``, ``anthropic``) whose request building we
    know: its base client's own ``_build_request(options, *, retries_taken)``, not one a
    subclass changed (Azure's); otherwise None (its calls are read at the HTTP layer)."""
    build = getattr(type(client), "_build_request", None)
    module = sys.modules.get(getattr(build, "__module__", "") or "")
    if build is None or module is None or not module.__name__.endswith("._base_client"):
        return None
    fields = getattr(getattr(module, "FinalRequestOptions", None), "model_fields", {})
    if list(inspect.signature(build).parameters) != ["self", "options", "retries_taken"] \
            or not _OPTIONS <= set(fields):
        return None
    return getattr(module, "_merge_mappings", None)


class _BuildLookup:
    """A known client's ``_build_request``: a batchable call (``post`` of a JSON object to a
    batched endpoint, not streamed, no raw response, a body of plain JSON values) is looked
    up from the request options before any request is built: ``json_data`` merged with
    ``extra_json`` exactly as ``_build_request`` does IS the body the client sends
    (``openapi_dumps`` of it). Not answered: recorded, ``BatchWait`` raised, nothing built.
    Answered: a bare request (a 2xx answer) or the client's own carries the answer on to
    ``_send_request`` or the transport. Any other call
    is built as the client builds it and read at the HTTP layer, as before."""

    def __init__(self, client: Any, transport: RecordingTransport,
                 merge: Callable[..., Any]) -> None:
        self.build, self.prepare_url = client._build_request, client._prepare_url
        self.transport, self.merge = transport, merge
        self.urls: dict[str, Any] = {}
        # (the client, its known resources to install once made: ``fastcalls.install``)
        self.later: tuple[Any, tuple[fastcalls.Known, ...]] | None = None

    def __call__(self, options: Any, *, retries_taken: int = 0) -> Any:
        if fastcalls.capturing():  # the fast path's self-check: what this call's body is
            raise fastcalls.Captured(self.batchable(options))
        answer = fastcalls.take_passed()  # looked up already, by the fast path (fastcalls.py)
        if answer is None:
            if self.later is not None:  # a resource made since: its fast create from now on
                client, waiting = self.later
                later = fastcalls.install(client, self.transport, waiting)
                self.later = (client, later) if later else None
            found = self.batchable(options)
            if found is None:
                return self.build(options, retries_taken=retries_taken)
            answer = self.transport.lookup(*found)
        if answer is not ONLINE and 200 <= answer.status < 300:
            request = self.bare(options.url)  # only its answer is read: no headers, no body
        else:  # sent online, or the client's error: the request it would send
            request = self.build(options, retries_taken=retries_taken)
        request.extensions[_LOOKED_UP] = answer
        return request

    def bare(self, url: str) -> Any:
        """A ``POST`` to ``url`` (the client's full URL, made once) with nothing else."""
        full = self.urls.get(url)
        if full is None:
            full = self.urls[url] = self.prepare_url(url)
        return self.transport.replayed.request(full)

    def batchable(self, options: Any) -> tuple[str, Canonical] | None:
        """The endpoint and canonical body of a call the fast path takes, or None."""
        if options.method.lower() != "post" or options.files is not None \
                or options.content is not None:
            return None
        headers = options.headers
        if headers and any(k.lower() in _HEADERS_APART for k in headers):
            return None
        path = options.url.partition("?")[0].rstrip("/")
        endpoint = _endpoint_of(path)
        body, extra = options.json_data, options.extra_json
        if extra is not None:
            body = extra if body is None else self.merge(body, extra) if isinstance(
                body, Mapping) else None
        if endpoint is None or type(body) is not dict or body.get("stream") \
                or not fastcalls.plain(body):
            return None
        try:
            return endpoint, Canonical(body, canonical_body(body))
        except ValueError:  # NaN, a lone surrogate: as the client fails it
            return None

