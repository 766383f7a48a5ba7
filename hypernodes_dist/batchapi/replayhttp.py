"""The HTTP objects of a replayed call, made as copies of one the constructor made.

An answered call of a known client gets a bare request (``POST`` to its URL) and, for a
2xx answer, its response without the HTTP client's send (``recording.py``): per answered
row an ``httpx.Request`` and an ``httpx.Response(status, content=body, request=...)``,
whose constructors encode headers, wrap the body in a stream and read it back (some 35 us
a row, a third of our replay cost). ``Replayed`` makes each as a shallow copy of a
prototype the constructor made once per HTTP package, with the fields that differ per
call (status, headers, the body and its stream, the request, extensions) set anew.

Self-checking: the first copy of each kind in a process is compared with the
constructor's object, field by field (the headers' raw items, the stream's bytes, every
other field's value or type); on any difference that kind is made by the constructor
from then on (an ``httpx`` whose objects carry other fields).
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

__all__ = ["Replayed"]

_JSON = b"application/json"


class Replayed:
    """Requests and responses of one HTTP package (``httpx`` or ``httpx2``) for answered
    calls."""

    def __init__(self, http: ModuleType) -> None:
        self.http = http
        self._lock = threading.Lock()
        self._response: dict[str, Any] | None = None  # the prototype's fields; None: unchecked
        self._request: dict[str, Any] | None = None
        self._fast = {"response": True, "request": True}

    def response(self, status: int, body: bytes, request: Any) -> Any:
        """``http.Response(status, content=body, request=request)`` as JSON."""
        if not self._fast["response"]:
            return self._made_response(status, body, request)
        proto = self._response
        if proto is None:
            return self._checked("response", self._copy_response, self._made_response,
                                 status, body, request)
        return self._copy_response(status, body, request)

    def request(self, url: Any) -> Any:
        """``http.Request("POST", url)`` (``url``: an ``http.URL``)."""
        if not self._fast["request"]:
            return self.http.Request("POST", url)
        if self._request is None:
            return self._checked("request", self._copy_request,
                                 lambda u: self.http.Request("POST", u), url)
        return self._copy_request(url)

    # -- the constructor's objects, and copies of them ---------------------------------------
    def _made_response(self, status: int, body: bytes, request: Any) -> Any:
        return self.http.Response(status, content=body, request=request,
                                  headers={"content-type": "application/json"})

    def _copy_response(self, status: int, body: bytes, request: Any) -> Any:
        proto = self._response
        if proto is None:
            proto = self._response = dict(vars(self._made_response(200, b"{}", None)))
        http = self.http
        r = object.__new__(http.Response)
        fields = r.__dict__
        fields.update(proto)
        fields["status_code"] = status
        fields["headers"] = self._headers(
            (b"content-type", _JSON), (b"Content-Length", str(len(body)).encode()))
        fields["_request"] = request
        fields["extensions"] = {}
        fields["history"] = []
        fields["stream"] = http.ByteStream(body)
        fields["_content"] = body
        return r

    def _copy_request(self, url: Any) -> Any:
        proto = self._request
        if proto is None:
            proto = self._request = dict(vars(self.http.Request("POST", url)))
        r = object.__new__(self.http.Request)
        fields = r.__dict__
        fields.update(proto)
        fields["url"] = url
        fields["headers"] = self._headers((b"Host", url.netloc), (b"Content-Length", b"0"))
        fields["extensions"] = {}
        fields["stream"] = self.http.ByteStream(b"")
        return r

    def _headers(self, *items: tuple[bytes, bytes]) -> Any:
        h = object.__new__(self.http.Headers)
        h._list = [(k, k.lower(), v) for k, v in items]
        h._encoding = None
        return h

    # -- the self-check ------------------------------------------------------------------------
    def _checked(self, kind: str, copy: Any, made: Any, *args: Any) -> Any:
        """The first copy of ``kind``, compared with the constructor's (which is returned
        when they differ, the fast path then off for ``kind``)."""
        with self._lock:
            try:
                fast = copy(*args)
                same = _fields(fast, self.http) == _fields(made(*args), self.http)
            except Exception:  # noqa: BLE001 - an httpx we do not know: the constructor
                same = False
            if not same:
                self._fast[kind] = False
                return made(*args)
            return fast


def _fields(obj: Any, http: ModuleType) -> dict[str, Any]:
    """``obj``'s fields in a comparable form (headers by raw items and encoding, streams
    by their bytes, objects without equality by type)."""
    out: dict[str, Any] = {}
    for name, value in vars(obj).items():
        if isinstance(value, http.Headers):
            out[name] = (type(value), list(value.raw), vars(value).keys())
        elif isinstance(value, http.ByteStream):
            out[name] = (type(value), b"".join(value))
        elif type(value).__eq__ is object.__eq__ and value is not None:
            out[name] = type(value)
        else:
            out[name] = value
    return out
