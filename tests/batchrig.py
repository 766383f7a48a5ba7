"""Helpers of the Batch API tests below the map: real ``openai``/``anthropic`` clients against
the loopback fake provider, rows that call them through recording clients, and a driver
driven until its batches have ended."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import anthropic
import openai

from hypernodes_bench.batch_server import BatchServer
from hypernodes_dist.batchapi.driver import BatchDriver
from hypernodes_dist.batchapi.recording import BatchWait, answered_scope, recording_client
from hypernodes_dist.batchapi.store import RequestLog
from hypernodes_dist.run.batchloop import Backoff, BatchLoop

CHAT = "/v1/chat/completions"
FAST = Backoff(first=0.05, factor=1.5, most=0.5)


def openai_client(server: BatchServer, kind: str = "sync") -> Any:
    cls = openai.AsyncOpenAI if kind == "async" else openai.OpenAI
    return cls(base_url=server.base_url, api_key="x", max_retries=0)


def anthropic_client(server: BatchServer) -> Any:
    return anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="x", max_retries=0)


def chat_body(text: str, model: str = "gpt-4o-mini") -> dict[str, Any]:
    """The body the openai client posts for ``chat(client, text, model)``."""
    return {"messages": [{"role": "user", "content": text}], "model": model}


def message_body(text: str, model: str = "claude-haiku") -> dict[str, Any]:
    """The body the anthropic client posts for ``message(client, text, model)``."""
    return {"max_tokens": 16, "messages": [{"role": "user", "content": text}], "model": model}


def chat(client: Any, text: str, model: str = "gpt-4o-mini") -> str:
    r = client.chat.completions.create(**chat_body(text, model))
    return str(r.choices[0].message.content)


def message(client: Any, text: str, model: str = "claude-haiku") -> str:
    r = client.messages.create(**message_body(text, model))
    return str(r.content[0].text)


class Rows:
    """A map's rows at the loop's level: ``node(clients, item)`` per item, through the
    loop's recording clients; a row that finished (a value or an error) does not run again."""

    def __init__(self, loop: BatchLoop, clients: dict[str, Any], items: Sequence[Any],
                 node: Callable[[dict[str, Any], Any], Any]) -> None:
        self.clients = {name: recording_client(c, loop.answers, loop.recorder(name))
                        for name, c in clients.items()}
        self.items, self.node, self.runs = items, node, 0
        self.out: dict[int, Any] = {}
        self.errors: dict[int, Exception] = {}

    def __call__(self) -> int:
        self.runs += 1
        waiting = 0
        for i, item in enumerate(self.items):
            if i in self.out or i in self.errors:
                continue
            try:
                with answered_scope():
                    self.out[i] = self.node(self.clients, item)
            except BatchWait:
                waiting += 1
            except Exception as exc:  # the item's error, as a map keeps it
                self.errors[i] = exc
        return waiting


def record(client: Any, call: Callable[[Any], Any]) -> None:
    """Run a node's call through a recording client: it must wait for a batch."""
    try:
        call(client)
    except BatchWait:
        return
    raise AssertionError("the call did not wait for a batch")


def drive(driver: BatchDriver, log: RequestLog, rounds: int = 200) -> None:
    """Submit and poll until nothing is live and nothing new was recorded."""
    async def loop() -> None:
        known: list[Any] = []
        for _ in range(rounds):
            known += log.new()
            await driver.submit(known)
            await driver.poll()
            if not driver.running and not driver.held and not list(driver.to_submit(known)):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("batches did not end")
    asyncio.run(loop())
