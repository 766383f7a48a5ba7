"""An answered call's HTTP request and response, made as copies of a prototype
(``batchapi/replayhttp.py``): equal to what the HTTP package's constructor makes, and the
constructor again once a first copy differs."""

from __future__ import annotations

import types

import httpx
import httpx2
import pytest

from hypernodes_dist.batchapi.replayhttp import Replayed, _fields

BODY = b'{"id":"chatcmpl-1","object":"chat.completion","choices":[]}'


@pytest.mark.parametrize("http", [httpx, httpx2])
def test_copies_equal_the_constructors(http: types.ModuleType) -> None:
    replayed = Replayed(http)
    url = http.URL("http://127.0.0.1:9/v1/chat/completions")
    for status, body in [(200, BODY), (201, b"{}"), (200, b"[" + BODY + b"," + BODY + b"]")]:
        request = replayed.request(url)
        response = replayed.response(status, body, request)
        assert _fields(request, http) == _fields(http.Request("POST", url), http)
        made = http.Response(status, content=body, request=request,
                             headers={"content-type": "application/json"})
        assert _fields(response, http) == _fields(made, http)
        assert response.json() == made.json() and response.request is request
        assert response.headers["content-length"] == str(len(body))
    assert replayed._fast == {"response": True, "request": True}
    other = replayed.response(200, b'{"a":1}', replayed.request(url))
    assert other.headers is not response.headers and other.extensions is not response.extensions


def test_a_copy_that_differs_turns_the_copies_off() -> None:
    class Sized(httpx.Response):  # a field that depends on the body: a copy keeps the prototype's
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            self.size = len(self.content)

    http = types.SimpleNamespace(**{k: getattr(httpx, k) for k in dir(httpx) if not k.startswith("_")})
    http.Response = Sized
    replayed = Replayed(http)  # type: ignore[arg-type]
    url = httpx.URL("http://127.0.0.1:9/v1/chat/completions")
    first = replayed.response(200, BODY, replayed.request(url))
    assert replayed._fast["response"] is False and replayed._fast["request"] is True
    assert first.size == len(BODY)
    assert replayed.response(200, b"{}", None).size == 2  # the constructor's from now on
