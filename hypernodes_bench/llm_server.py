"""A loopback OpenAI-compatible server for tests, benchmarks and the example (no network).

``LLMServer`` starts ``python -m hypernodes_bench.llm_server`` as a subprocess (aiohttp) on
127.0.0.1 and stops it on exit:

    with LLMServer(latency=(0.010, 0.030), rpm=600, tpm=20_000) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x")
        ...
        server.stats()   # requests, ok, rate_limited, failed, chat, embeddings, tokens, ...

- ``POST /v1/chat/completions``: after a uniform ``latency``, a ``chat.completion`` whose
  content is ``"positive"`` or ``"negative"`` (a deterministic function of the last user
  message) with ``usage``: prompt tokens = whitespace words of all messages + 4,
  completion tokens = 1 (or ``max_tokens``).
- ``POST /v1/embeddings``: ``input`` a string or a list of at most ``max_batch`` strings
  (more: HTTP 400); deterministic 8-float vectors.
- Limits (``rpm``, ``tpm``): a sliding window of ``window_seconds`` counting requests and
  tokens (a request's tokens counted when admitted, estimated from its messages and
  ``max_tokens``). Past either limit: HTTP 429 with an OpenAI-style error and a
  ``retry-after`` header (seconds until enough of the window frees). Every response
  carries OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers
  (``reset``: the time the used part takes to come back at ``limit/window_seconds`` a
  second, OpenAI's meaning; the window's own oldest expiry would read as a far longer
  period to a client learning the limits).
- ``bucket=True``: limits as OpenAI enforces them instead: per API key (the
  ``Authorization`` header), a token bucket of ``rpm`` requests (and ``tpm`` tokens)
  refilled continuously (``rpm/60`` a second), starting with ``remaining`` of them (a
  nearly spent key); ``x-ratelimit-reset-*`` is the time until the bucket is full.
  ``headers=False``: no ``x-ratelimit-*`` headers (429s still carry ``retry-after``).
  ``GET /keys``: per key, requests, ok, refused, peak in flight and the most requests
  admitted in any ``--peak-seconds`` (1 s) sliding window; ``GET /log``: per key, each
  request's arrival (wall clock) and status.
- ``fail_rate``: that fraction of requests answers HTTP 500 (seeded, deterministic).
- Markers in a chat request's last user message fail it on purpose, as a provider does:
  ``[[status:429 code=insufficient_quota retry-after=30]]`` answers every time with that
  status, the error body's ``code``/``type`` and those headers (``retry-after=abc`` sends
  ``abc`` as is; ``should-retry=false`` sends ``x-should-retry: false``);
  ``[[status:429:2 retry-after=abc]]`` only the first 2 times that message arrives.
- ``GET /answered``: per last user message, how many requests were answered 200 (a row
  paid twice shows as 2).
- ``LLMServer(...).start(within=other)``: the server listens in ``other``'s process, on a
  port of its own with its own options and counts (``POST /listen``): no process to start.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import random
import re
import subprocess
import time
from collections import deque
from typing import Any

from aiohttp import web

from hypernodes_bench.loopback import Loopback, serve_until_orphaned

__all__ = ["LLMServer", "label_of", "tokens_of", "marker_failure"]

_MARKER = re.compile(r"\[\[status:(\d{3})(?::(\d+))?((?:\s+[a-z-]+=\S+?)*)\]\]")


def label_of(text: str) -> str:
    """The server's deterministic answer to a user message."""
    return "positive" if hashlib.blake2b(text.encode(), digest_size=1).digest()[0] % 2 else "negative"


def tokens_of(messages: list[dict[str, Any]]) -> int:
    """Prompt tokens of a chat request, as the server counts them."""
    return sum(len(str(m.get("content", "")).split()) for m in messages) + 4


def marker_failure(text: str, seen: int) -> tuple[int, str, dict[str, str]] | None:
    """``(status, code, headers)`` the markers of ``text`` ask for at its ``seen``-th
    arrival (1 = first), or ``None`` to answer normally."""
    m = _MARKER.search(text)
    if m is None or (m.group(2) is not None and seen > int(m.group(2))):
        return None
    status = int(m.group(1))
    options = dict(kv.split("=", 1) for kv in m.group(3).split())
    default = "rate_limit_exceeded" if status == 429 else "server_error"
    code = options.pop("code", default if status >= 429 else "invalid_request_error")
    headers = {{"should-retry": "x-should-retry"}.get(k, k): v for k, v in options.items()}
    return status, code, headers


def _last_user(body: dict[str, Any]) -> str:
    messages = body.get("messages") or []
    last = next((m for m in reversed(messages) if isinstance(m, dict)
                 and m.get("role") == "user"), {"content": ""})
    return str(last.get("content", ""))


class Window:
    """Requests and tokens admitted in the last ``seconds`` (a sliding window)."""

    def __init__(self, rpm: int | None, tpm: int | None, seconds: float) -> None:
        self.rpm, self.tpm, self.seconds = rpm, tpm, seconds
        self.events: deque[tuple[float, int]] = deque()
        self.tokens = 0

    def _expire(self, now: float) -> None:
        while self.events and self.events[0][0] <= now - self.seconds:
            self.tokens -= self.events.popleft()[1]

    def admit(self, tokens: int) -> float:
        """0 when admitted (counted), else the seconds until it would be."""
        now = time.monotonic()
        self._expire(now)
        wait = 0.0
        if self.rpm is not None and len(self.events) + 1 > self.rpm:
            wait = self.events[len(self.events) - self.rpm][0] + self.seconds - now
        if self.tpm is not None and self.tokens + tokens > self.tpm:
            freed, need = 0, self.tokens + tokens - self.tpm
            for at, used in self.events:
                freed += used
                if freed >= need:
                    wait = max(wait, at + self.seconds - now)
                    break
        if wait > 0:
            return wait
        self.events.append((now, tokens))
        self.tokens += tokens
        return 0.0

    def headers(self) -> dict[str, str]:
        """OpenAI's headers; ``reset`` as OpenAI means it (PROVIDERS.md): the time a limit
        refilled continuously (``limit`` per ``seconds``) takes to give back what is used."""
        self._expire(time.monotonic())
        out = {}
        for name, limit, used in (("requests", self.rpm, len(self.events)),
                                  ("tokens", self.tpm, self.tokens)):
            if limit is not None:
                out.update({f"x-ratelimit-limit-{name}": str(limit),
                            f"x-ratelimit-remaining-{name}": str(max(0, limit - used)),
                            f"x-ratelimit-reset-{name}":
                                f"{min(used, limit) * self.seconds / limit:.3f}s"})
        return out


class Bucket:
    """One API key's token buckets (``rpm`` requests, ``tpm`` tokens), refilled
    continuously, as OpenAI limits a key."""

    def __init__(self, rpm: int | None, tpm: int | None, remaining: float | None) -> None:
        self.rpm, self.tpm = rpm, tpm
        self.at = time.monotonic()
        share = 1.0 if remaining is None or not rpm else min(1.0, remaining / rpm)
        self.requests = float(rpm or 0) * share  # ``remaining`` requests left at first
        self.tokens = float(tpm or 0) * share

    def _refill(self, now: float) -> None:
        dt, self.at = now - self.at, now
        if self.rpm:
            self.requests = min(float(self.rpm), self.requests + dt * self.rpm / 60.0)
        if self.tpm:
            self.tokens = min(float(self.tpm), self.tokens + dt * self.tpm / 60.0)

    def admit(self, tokens: int) -> float:
        """0 when admitted (taken from the buckets), else the seconds until it would be."""
        self._refill(time.monotonic())
        wait = 0.0
        if self.rpm and self.requests < 1:
            wait = (1 - self.requests) * 60.0 / self.rpm
        if self.tpm and self.tokens < tokens:
            wait = max(wait, (tokens - self.tokens) * 60.0 / self.tpm)
        if wait > 0:
            return wait
        if self.rpm:
            self.requests -= 1
        if self.tpm:
            self.tokens -= tokens
        return 0.0

    def headers(self) -> dict[str, str]:
        self._refill(time.monotonic())
        out = {}
        if self.rpm:
            full = (self.rpm - self.requests) * 60.0 / self.rpm
            out.update({"x-ratelimit-limit-requests": str(self.rpm),
                        "x-ratelimit-remaining-requests": str(int(self.requests)),
                        "x-ratelimit-reset-requests": f"{full:.3f}s"})
        if self.tpm:
            full = (self.tpm - self.tokens) * 60.0 / self.tpm
            out.update({"x-ratelimit-limit-tokens": str(self.tpm),
                        "x-ratelimit-remaining-tokens": str(int(self.tokens)),
                        "x-ratelimit-reset-tokens": f"{full:.3f}s"})
        return out


class KeyStats:
    """What one API key sent: counts, peak in flight, most admitted in a sliding window."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.counts = dict.fromkeys(("requests", "ok", "rate_limited", "max_in_flight",
                                     "peak_window"), 0)
        self.in_flight = 0
        self.admitted: deque[float] = deque()
        self.log: list[tuple[float, int]] = []  # (arrival, wall clock; status), the first 10,000

    def admit(self) -> None:
        now = time.monotonic()
        self.admitted.append(now)
        while self.admitted[0] <= now - self.seconds:
            self.admitted.popleft()
        self.counts["peak_window"] = max(self.counts["peak_window"], len(self.admitted))


class App:
    """The server's state and handlers."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.latency = (args.latency_min, args.latency_max)
        self.window = Window(args.rpm, args.tpm, args.window_seconds)
        self.args = args
        self.buckets: dict[str, Bucket] = {}  # per API key (``--bucket``)
        self.keys: dict[str, KeyStats] = {}
        self.max_batch = args.max_batch
        self.fail_rate = args.fail_rate
        self.random = random.Random(args.seed)
        self.in_flight = 0
        self.stats: dict[str, int] = {}
        self.seen: dict[str, int] = {}  # arrivals per last user message (markers)
        self.answered: dict[str, int] = {}  # 200 answers per last user message
        self.reset_stats()

    def reset_stats(self) -> None:
        self.stats = dict.fromkeys(("requests", "ok", "rate_limited", "failed", "chat",
                                    "embeddings", "embedding_inputs", "tokens", "max_in_flight"), 0)
        self.seen, self.answered = {}, {}
        self.keys = {}

    async def handle(self, request: Any, kind: str) -> Any:
        arrived = time.time()
        body = await request.json()
        key = request.headers.get("Authorization", "").removeprefix("Bearer ")
        per_key = self.keys.get(key)
        if per_key is None:
            per_key = self.keys[key] = KeyStats(self.args.peak_seconds)
        self.stats["requests"] += 1
        per_key.counts["requests"] += 1
        self.in_flight += 1
        per_key.in_flight += 1
        self.stats["max_in_flight"] = max(self.stats["max_in_flight"], self.in_flight)
        per_key.counts["max_in_flight"] = max(per_key.counts["max_in_flight"], per_key.in_flight)
        try:
            response = await self._answer(body, kind, key)
        finally:
            self.in_flight -= 1
            per_key.in_flight -= 1
        status = response.status
        if len(per_key.log) < 10_000:
            per_key.log.append((arrived, status))
        outcome = "ok" if status == 200 else "rate_limited" if status == 429 else "failed"
        per_key.counts[outcome] = per_key.counts.get(outcome, 0) + 1
        return response

    def _limits(self, key: str) -> Window | Bucket:
        """The limits the request's key is under: one sliding window for every key, or
        (``--bucket``) the key's own buckets."""
        if not self.args.bucket:
            return self.window
        found = self.buckets.get(key)
        if found is None:
            a = self.args
            found = self.buckets[key] = Bucket(a.rpm, a.tpm, a.remaining)
        return found

    async def _answer(self, body: dict[str, Any], kind: str, key: str) -> Any:
        inputs = body.get("input", "")
        if kind == "embeddings" and isinstance(inputs, list) and len(inputs) > self.max_batch:
            return _error(400, f"at most {self.max_batch} inputs per request, got {len(inputs)}",
                          "invalid_request_error", {})
        text = _last_user(body) if kind == "chat" else ""
        if "[[" in text:
            self.seen[text] = self.seen.get(text, 0) + 1
            failure = marker_failure(text, self.seen[text])
            if failure is not None:
                status, code, headers = failure
                self.stats["rate_limited" if status == 429 else "failed"] += 1
                return _error(status, f"marked to fail with {status} ({code})", code, headers)
        tokens = self._tokens(body, kind)
        limits = self._limits(key)
        wait = limits.admit(tokens)
        headers = limits.headers() if self.args.headers else {}
        if wait > 0:
            self.stats["rate_limited"] += 1
            headers["retry-after"] = f"{math.ceil(wait * 1000) / 1000:g}"
            return _error(429, "Rate limit reached; retry later", "rate_limit_exceeded", headers)
        self.keys[key].admit()
        await asyncio.sleep(self.random.uniform(*self.latency))
        if self.fail_rate and self.random.random() < self.fail_rate:
            self.stats["failed"] += 1
            return _error(500, "The server had an error", "server_error", headers)
        self.stats["ok"] += 1
        self.stats["tokens"] += tokens
        self.stats[kind] += 1
        if kind == "chat":
            self.answered[text] = self.answered.get(text, 0) + 1
        answer = _chat(body, tokens) if kind == "chat" else self._embeddings(inputs, tokens)
        return web.json_response(answer, headers=headers)

    def _tokens(self, body: dict[str, Any], kind: str) -> int:
        if kind == "chat":
            return tokens_of(body.get("messages", [])) + int(body.get("max_tokens") or 1)
        inputs = body.get("input", "")
        texts = inputs if isinstance(inputs, list) else [inputs]
        return sum(len(str(t).split()) for t in texts) or 1

    def _embeddings(self, inputs: Any, tokens: int) -> dict[str, Any]:
        texts = inputs if isinstance(inputs, list) else [inputs]
        self.stats["embedding_inputs"] += len(texts)
        data = [{"object": "embedding", "index": i, "embedding": _vector(str(t))}
                for i, t in enumerate(texts)]
        return {"object": "list", "data": data, "model": "loopback-embed",
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _vector(text: str) -> list[float]:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return [b / 255.0 for b in digest]


def _chat(body: dict[str, Any], tokens: int) -> dict[str, Any]:
    completion = int(body.get("max_tokens") or 1)
    return {
        "id": "chatcmpl-loopback", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model", "loopback"),
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": label_of(_last_user(body))}}],
        "usage": {"prompt_tokens": tokens - completion, "completion_tokens": completion,
                  "total_tokens": tokens},
    }


def _error(status: int, message: str, code: str, headers: dict[str, str]) -> Any:
    payload = {"error": {"message": message, "type": code, "param": None, "code": code}}
    return web.json_response(payload, status=status, headers=headers)


def _serve(args: argparse.Namespace) -> None:
    async def main() -> None:
        # idle keep-alive connections stay open: a server closing one while a client sends
        # on it is a lost request for clients without a timeout
        await serve_until_orphaned(_runner(args), args.port)

    asyncio.run(main())


def _runner(args: argparse.Namespace) -> web.AppRunner:
    return web.AppRunner(_web_app(args), access_log=None, keepalive_timeout=3600)


_LISTENERS: list[web.AppRunner] = []  # the servers ``/listen`` started in this process


async def _listen(request: Any) -> Any:
    """``POST /listen`` (a list of command-line options): another server in this process,
    with those options, on a port of its own; answers ``{"port": port}``."""
    runner = _runner(_parse(await request.json()))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    _LISTENERS.append(runner)
    return web.json_response({"port": runner.addresses[0][1]})


def _web_app(args: argparse.Namespace) -> web.Application:
    app = App(args)
    web_app = web.Application()

    async def stats(request: Any) -> Any:
        return web.json_response(app.stats)

    async def answered(request: Any) -> Any:
        return web.json_response(app.answered)

    async def keys(request: Any) -> Any:
        return web.json_response({k: v.counts for k, v in app.keys.items()})

    async def log(request: Any) -> Any:
        return web.json_response({k: v.log for k, v in app.keys.items()})

    async def reset(request: Any) -> Any:
        app.reset_stats()
        return web.json_response({"ok": True})

    web_app.router.add_post("/v1/chat/completions", lambda r: app.handle(r, "chat"))
    web_app.router.add_post("/v1/embeddings", lambda r: app.handle(r, "embeddings"))
    web_app.router.add_get("/stats", stats)
    web_app.router.add_get("/answered", answered)
    web_app.router.add_get("/keys", keys)
    web_app.router.add_get("/log", log)
    web_app.router.add_post("/reset", reset)
    web_app.router.add_post("/listen", _listen)
    return web_app


class LLMServer(Loopback):
    """The server as a subprocess on 127.0.0.1 (a context manager)."""

    module, what = "hypernodes_bench.llm_server", "the loopback LLM server"

    def __init__(self, latency: tuple[float, float] = (0.010, 0.030), rpm: int | None = None,
                 tpm: int | None = None, window_seconds: float = 60.0, max_batch: int = 64,
                 fail_rate: float = 0.0, seed: int = 0, bucket: bool = False,
                 remaining: float | None = None, headers: bool = True,
                 peak_seconds: float = 1.0) -> None:
        self.options = ["--latency-min", str(latency[0]), "--latency-max", str(latency[1]),
                        "--window-seconds", str(window_seconds), "--max-batch", str(max_batch),
                        "--fail-rate", str(fail_rate), "--seed", str(seed),
                        "--peak-seconds", str(peak_seconds)]
        self.options += ["--bucket"] if bucket else []
        self.options += ["--no-headers"] if not headers else []
        self.options += ["--remaining", str(remaining)] if remaining is not None else []
        if rpm is not None:
            self.options += ["--rpm", str(rpm)]
        if tpm is not None:
            self.options += ["--tpm", str(tpm)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """What ``openai.AsyncOpenAI(base_url=...)`` takes."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, within: LLMServer | None = None) -> LLMServer:
        """Start the server in a process of its own, or (``within``) in the process of that
        running server, on a port of its own with its own options, state and counts (no
        process start; it ends with that process)."""
        if within is None:
            self._launch(self.options)
        else:
            self.port = int(within.call("/listen", self.options, timeout=10)["port"])
        return self

    def stats(self) -> dict[str, int]:
        return self.call("/stats", timeout=10)

    def answered(self) -> dict[str, int]:
        """Per last user message, the requests answered 200 (paid)."""
        return self.call("/answered", timeout=10)

    def keys(self) -> dict[str, dict[str, int]]:
        """Per API key: requests, ok, rate_limited, failed, max_in_flight, peak_window."""
        return self.call("/keys", timeout=10)

    def log(self, key: str) -> list[tuple[float, int]]:
        """The requests of API ``key``: (arrival time, wall clock; status), in order."""
        return [tuple(x) for x in self.call("/log", timeout=10).get(key, [])]

    def reset(self) -> None:
        self.call("/reset", {}, timeout=10)

    def __enter__(self) -> LLMServer:
        return self.start()


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--latency-min", type=float, default=0.010)
    p.add_argument("--latency-max", type=float, default=0.030)
    p.add_argument("--rpm", type=int, default=None)
    p.add_argument("--tpm", type=int, default=None)
    p.add_argument("--window-seconds", type=float, default=60.0)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--fail-rate", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket", action="store_true")
    p.add_argument("--remaining", type=float, default=None)
    p.add_argument("--no-headers", dest="headers", action="store_false")
    p.add_argument("--peak-seconds", type=float, default=1.0)
    return p.parse_args(argv)


if __name__ == "__main__":
    _serve(_parse())
