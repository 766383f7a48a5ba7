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

from hypernodes_dist.batchapi.identity import Canonical, canonical_body, digest_of
from hypernodes_dist.errors import BudgetExceededError

__all__ = ["Answer", "ONLINE", "REFUSED", "BudgetRefusal", "refusal_answer", "AnswerLookup", "BatchWait", "UnbatchableCall", "RecordingTransport",
           "recording_client", "batch_endpoint", "in_batch_api",
           "answered_scope"]

# the endpoints the providers batch, by the end of the path the client posts to
_ENDPOINTS = {"/chat/completions": "/v1/chat/completions", "/embeddings": "/v1/embeddings",
              "/responses": "/v1/responses", "/messages": "/v1/messages"}
_RAW = "x-stainless-raw-response"
_ANSWERED: contextvars.ContextVar[bool] = contextvars.ContextVar("hn_batch_answered",
                                                                 default=False)


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


def batch_endpoint(request: Any) -> tuple[str, dict[str, Any]]:
    """The batch endpoint and JSON body of an HTTP request (``httpx``/``httpx2``), or
    ``UnbatchableCall`` naming it."""
    path = request.url.path.rstrip("/")
    what = f"{request.method} {path}"
    if request.headers.get(_RAW, "").lower() == "true":
        raise UnbatchableCall(f"{what} with with_raw_response")
    endpoint = next((e for end, e in _ENDPOINTS.items() if path.endswith(end)), None)
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


_JSON_HEADERS = {"content-type": "application/json"}


def _json(body: Any) -> Any:
    return json.loads(body) if isinstance(body, bytes) else body


class RecordingTransport:
    """An HTTP transport (sync and async) that answers from ``answers`` and records the
    rest; ``http`` is the HTTP package the client is built on (``httpx`` or ``httpx2``)."""

    def __init__(self, answers: AnswerLookup, record: Record, http: ModuleType,
                 online: Any = None) -> None:
        self.answers, self.record, self.http = answers, record, http
        self.online = online  # the original client's HTTP client: ONLINE requests go there

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
        endpoint, parsed = batch_endpoint(request)
        body = Canonical(parsed, canonical_body(parsed))  # encoded once: the log reuses it
        digest = digest_of(endpoint, body.canonical)
        raw = getattr(self.answers, "raw", None)  # the body as JSON bytes, when it can
        answer = raw(digest) if raw is not None else self.answers.get(digest)
        if answer is None:
            self.record(endpoint, body)
            raise BatchWait(endpoint, digest)
        if answer.status == REFUSED:
            raise BudgetRefusal(_json(answer.body))
        return ONLINE if answer.status == 0 else answer

    def _response(self, request: Any, answer: Answer) -> Any:
        _ANSWERED.set(True)
        if isinstance(answer.body, bytes):
            return self.http.Response(answer.status, content=answer.body, request=request,
                                      headers=_JSON_HEADERS)
        return self.http.Response(answer.status, json=answer.body, request=request)

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


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
    return client.copy(http_client=http_client, max_retries=0)
