"""A batch driver in its own process, SIGKILLed by itself at a chosen point (the kill tests
of ``test_batch_driver.py``): ``python batch_kill_child.py PROVIDER BASE_URL FOLDER KILL_AT``
with KILL_AT one of upload, create, poll, download, or "" to run to the end (the tests'
reruns await ``main`` in their own process)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from hypernodes_dist.batchapi import AnthropicBatches, OpenAIBatches
from hypernodes_dist.batchapi.driver import BatchDriver
from hypernodes_dist.batchapi.store import RequestLog


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def killing(base: type, kill_at: str) -> type:
    class Killing(base):  # type: ignore[misc, valid-type]
        async def upload(self, file: Any) -> str:
            got = await super().upload(file)
            if kill_at == "upload":
                _die()
            return got

        async def create(self, *args: Any, **kw: Any) -> Any:
            got = await super().create(*args, **kw)
            if kill_at == "create":
                _die()
            return got

        async def status(self, batch_id: str) -> Any:
            got = await super().status(batch_id)
            if kill_at == "poll":
                _die()
            return got

        def results(self, info: Any) -> Any:
            return _dying_at_download(super().results(info), kill_at)

        def results_at_once(self, info: Any) -> Any:  # the driver's way where a base has it
            read = getattr(super(), "results_at_once", super().results)
            return _dying_at_download(read(info), kill_at)
    return Killing


async def _dying_at_download(lines: Any, kill_at: str) -> Any:
    async for r in lines:
        if kill_at == "download":
            _die()
        yield r


async def main(provider: str, base_url: str, folder: str, kill_at: str) -> None:
    # only the provider's client is imported: a child pays ~0.7 (openai) or ~1.4 (anthropic)
    # CPU s for each, and the kill tests start 16 children
    if provider == "openai":
        import openai

        client: Any = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        transport = killing(OpenAIBatches, kill_at)(client, "kill-map")
    else:
        import anthropic

        client = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)
        transport = killing(AnthropicBatches, kill_at)(client, "kill-map")
    driver = BatchDriver(transport, folder)
    requests = RequestLog(folder).new()
    for _ in range(600):
        if await driver.recover() == 0:
            await driver.submit(requests)
            await driver.poll()
            if not driver.running and not list(driver.to_submit(requests)):
                return
        await asyncio.sleep(0.05)
    raise SystemExit("batches did not end")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
