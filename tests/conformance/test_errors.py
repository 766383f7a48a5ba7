"""Errors keep their type: an exception raised in a node, in any process of any engine,
reaches the caller as its own class with its attributes (``MapResult`` items, a raised
map), not as a ``NodeError`` standing in for it."""

from __future__ import annotations

import httpx
import openai
import pytest

from hypernodes_dist import Graph

from . import error_graphs as G


@pytest.fixture(scope="module")
def server(llm_servers):
    return llm_servers(latency=(0.001, 0.002))


def _check_bad_request(error: BaseException) -> None:
    assert type(error) is openai.BadRequestError
    assert error.status_code == 400
    assert error.response.status_code == 400
    assert error.response.headers["content-type"].startswith("application/json")
    assert "at most 64 inputs" in error.body["message"]
    assert any("'embed'" in note for note in error.__notes__)


def test_a_providers_error_keeps_its_class_and_attributes(engine, server):
    g = Graph([G.sync_llm, G.embed], engine=engine)
    res = g.map({"n": [1, 100, 2], "base_url": server.base_url}, map_over="n",
                on_error="collect")
    assert [r["vectors"] for r in res if r.status == "complete"] == [1, 2]
    [failed] = res.errors
    _check_bad_request(failed.error)


def test_a_raised_map_raises_the_providers_error_itself(engine, server):
    g = Graph([G.sync_llm, G.embed], engine=engine)
    with pytest.raises(openai.BadRequestError) as info:
        g.map({"n": [100], "base_url": server.base_url}, map_over="n")
    _check_bad_request(info.value)


def test_an_http_status_error_keeps_its_response_and_request(engine, server):
    g = Graph([G.web, G.fetch], engine=engine)
    res = g.map({"path": ["/missing"], "base_url": server.base_url}, map_over="path",
                on_error="collect")
    error = res[0].error
    assert type(error) is httpx.HTTPStatusError
    assert error.response.status_code == 404
    assert error.request.method == "GET" and error.request.url.path == "/v1/missing"
