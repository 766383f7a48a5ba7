"""The loopback OpenAI-compatible server the tests and benchmarks use: real ``openai`` and
``httpx`` clients get OpenAI-shaped answers, 429s with ``retry-after`` past a limit, stats."""

from __future__ import annotations

import httpx
import openai
import pytest

from hypernodes_bench.llm_server import LLMServer, label_of


@pytest.fixture(scope="module")
def limited():
    with LLMServer(latency=(0.001, 0.002), rpm=3, window_seconds=30) as server:
        yield server


def test_chat_and_embeddings_answer_like_openai(llm_server):
    client = openai.OpenAI(base_url=llm_server.base_url, api_key="x", max_retries=0)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi you"}])
    assert r.choices[0].message.content == label_of("hi you")
    assert r.usage.prompt_tokens == 6 and r.usage.total_tokens == 7
    e = client.embeddings.create(model="e", input=["a", "b", "c"])
    assert [d.index for d in e.data] == [0, 1, 2] and len(e.data[0].embedding) == 8
    with pytest.raises(openai.BadRequestError, match="at most 64 inputs"):
        client.embeddings.create(model="e", input=["x"] * 65)


def test_past_the_limit_a_429_carries_retry_after(limited):
    limited.reset()
    with httpx.Client(base_url=limited.base_url) as client:
        codes = [client.post("/chat/completions", json={"messages": [{"role": "user",
                                                                      "content": "x"}]})
                 for _ in range(5)]
    assert [r.status_code for r in codes] == [200, 200, 200, 429, 429]
    late = codes[-1]
    assert 0 < float(late.headers["retry-after"]) <= 30
    assert late.headers["x-ratelimit-remaining-requests"] == "0"
    assert late.headers["x-ratelimit-limit-requests"] == "3"
    stats = limited.stats()
    assert stats["requests"] == 5 and stats["ok"] == 3 and stats["rate_limited"] == 2


def test_markers_fail_a_message_as_a_provider_does(llm_server):
    llm_server.reset()
    client = openai.OpenAI(base_url=llm_server.base_url, api_key="x", max_retries=0)

    def ask(text: str):
        return client.chat.completions.create(model="m", messages=[{"role": "user",
                                                                    "content": text}])

    quota = "a [[status:429 code=insufficient_quota retry-after=30]]"
    with pytest.raises(openai.RateLimitError) as err:
        ask(quota)
    assert err.value.code == "insufficient_quota" and err.value.body["type"] == "insufficient_quota"
    assert err.value.response.headers["retry-after"] == "30"
    once = "b [[status:503:1 retry-after=abc should-retry=false]]"
    with pytest.raises(openai.InternalServerError) as err:
        ask(once)
    headers = err.value.response.headers
    assert headers["retry-after"] == "abc" and headers["x-should-retry"] == "false"
    assert ask(once).choices[0].message.content == label_of(once)  # only the first time
    assert llm_server.answered() == {once: 1}
