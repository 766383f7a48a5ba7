"""Resources and nodes of the resource conformance tests, at module level so worker
processes import them. Real clients (``openai``, ``httpx``, ``aiohttp``) call the loopback
server; builds and teardowns are recorded as files ``<event>-<resource>-<pid>-<n>`` in
``log_dir`` (an input), since worker processes share no memory with the driver.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import aiohttp
import httpx
import openai

from hypernodes_dist import node, resource


def record(log_dir: str, event: str, name: str) -> None:
    Path(log_dir, f"{event}-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}").touch()


def events(log_dir: str, event: str, name: str) -> dict[int, int]:
    """``{pid: count}`` of ``event`` ("build" / "teardown") of resource ``name``."""
    out: dict[int, int] = {}
    for f in Path(log_dir).iterdir():
        kind, res, pid, _ = f.name.split("-")
        if kind == event and res == name:
            out[int(pid)] = out.get(int(pid), 0) + 1
    return out


# ------------------------------------------------------------------ openai, held by a resource


@resource
def llm(base_url: str, log_dir: str):
    record(log_dir, "build", "llm")
    yield openai.AsyncOpenAI(base_url=base_url, api_key="loopback", max_retries=0, timeout=5.0)
    record(log_dir, "teardown", "llm")


@node(output_name="label", retries=5, concurrency=16)
async def classify(text: str, llm) -> str:
    r = await llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content


# ------------------------------------------------------------------ httpx and aiohttp


@resource
async def web(base_url: str, log_dir: str):
    """An ``httpx.AsyncClient``, closed by the teardown (async generator)."""
    record(log_dir, "build", "web")
    client = httpx.AsyncClient(base_url=base_url, timeout=5.0)
    yield client
    await client.aclose()
    record(log_dir, "teardown", "web")


@node(output_name="label", retries=5)
async def classify_httpx(text: str, web) -> str:
    r = await web.post("/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": text}]})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


@resource
async def session(log_dir: str):
    """An ``aiohttp.ClientSession`` (it must be built inside a running loop)."""
    record(log_dir, "build", "session")
    s = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
    yield s
    await s.close()
    record(log_dir, "teardown", "session")


@node(output_name="label", retries=5)
async def classify_aiohttp(text: str, base_url: str, session) -> str:
    async with session.post(f"{base_url}/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": text}]}) as r:
        r.raise_for_status()
        body = await r.json()
    return body["choices"][0]["message"]["content"]


# ------------------------------------------------------------------ a resource of a resource


@resource
def settings(log_dir: str):
    record(log_dir, "build", "settings")
    return {"model": "loopback"}


@resource
def configured(settings, base_url: str, log_dir: str):
    record(log_dir, "build", "configured")
    return openai.OpenAI(base_url=base_url, api_key="loopback", max_retries=0,
                         timeout=5.0), settings


@node(output_name="label", retries=5)
def classify_sync(text: str, configured) -> str:
    client, conf = configured
    r = client.chat.completions.create(
        model=conf["model"], messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content


# ------------------------------------------------------------------ a failing build


@resource
def broken(log_dir: str):
    record(log_dir, "build", "broken")
    raise ConnectionRefusedError("the model server is down")


@node(output_name="label")
def needs_broken(text: str, broken) -> str:
    return text


# ------------------------------------------------------------------ a module-level client

CLIENT = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="loopback", max_retries=0,
                            timeout=5.0)  # a lost request is retried, never awaited for ever


@node(output_name="label", retries=5)
async def classify_global(text: str, base_url: str) -> str:
    """The common habit: a client at module level (same connection pool for every call)."""
    r = await CLIENT.with_options(base_url=base_url).chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content


# ------------------------------------------------------------------ an endpoint not in the key


@resource(not_in_key=("base_url", "api_key"))
def endpoint_llm(base_url: str, api_key: str = "loopback"):
    """Any endpoint and key give the same results: a change of either keeps cache hits and
    resumes a dataset map."""
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=5.0)


@node(output_name="label", retries=5, concurrency=16)
async def classify_anywhere(text: str, endpoint_llm) -> str:
    r = await endpoint_llm.chat.completions.create(
        model="loopback", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content
