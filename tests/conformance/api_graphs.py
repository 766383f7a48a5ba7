"""Resources and nodes of the API-limits conformance tests (module level: worker processes
import them). Each resource holds a real ``openai.AsyncOpenAI`` client of the loopback
server, whose limits are per API key (``api_key``, an input)."""

from __future__ import annotations

import openai

from hypernodes_dist import meter, node, resource


def _client(base_url: str, api_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=10.0)


async def _ask(client: openai.AsyncOpenAI, text: str) -> str:
    r = await client.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content or ""


# one limit for the API, two nodes calling it
@resource(concurrency=3, rate_limit="30/second")
def shared_api(base_url: str, api_key: str):
    return _client(base_url, api_key)


@node(output_name="first", retries=5)
async def ask_first(text: str, shared_api) -> str:
    return await _ask(shared_api, text)


@node(output_name="second", retries=5)
async def ask_second(text: str, shared_api) -> str:
    return await _ask(shared_api, "again " + text)


# a hold-off while calls queue at the resource's concurrency
@resource(concurrency=2)
def narrow_api(base_url: str, api_key: str):
    return _client(base_url, api_key)


@node(output_name="label", retries=3)
async def ask_narrow(text: str, narrow_api) -> str:
    return await _ask(narrow_api, text)


# no limit declared: the provider's headers state them
@resource
def open_api(base_url: str, api_key: str):
    return _client(base_url, api_key)


@node(output_name="label", retries=8)
async def ask_open(text: str, open_api) -> str:
    return await _ask(open_api, text)


# no limit declared, tokens metered: paced by the requests and tokens the headers state
@resource
def window_api(base_url: str, api_key: str):
    return _client(base_url, api_key)


@node(output_name="label", retries=8)
async def ask_window(text: str, window_api) -> str:
    r = await window_api.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}])
    meter(tokens=r.usage.total_tokens)
    return r.choices[0].message.content or ""


# a back-off: the API's width lowered by a 429 binds every process together
@resource(rate_limit="400/second")
def backoff_api(base_url: str, api_key: str):
    return _client(base_url, api_key)


@node(output_name="label", retries=3, concurrency=8)
async def ask_backoff(text: str, backoff_api) -> str:
    return await _ask(backoff_api, text)
