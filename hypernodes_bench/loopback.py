"""What the loopback fakes share (``llm_server.py``, ``batch_server.py``): a server module run
as a subprocess on 127.0.0.1 that prints its port, a context manager that starts and stops
it, JSON calls to it, and the server side's listening socket and orphan watchdog."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from typing import Any

from aiohttp import web

__all__ = ["Loopback", "serve_until_orphaned"]


class Loopback:
    """``python -m module --port 0 *args`` as a subprocess on 127.0.0.1 (a context manager);
    ``stop_signal`` is what ``stop()`` sends first (then a kill after 10 s)."""

    module: str = ""
    what: str = "the loopback server"
    stop_signal: int = signal.SIGTERM

    def _launch(self, args: list[str]) -> None:
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", self.module, "--port", "0", *args], stdout=subprocess.PIPE)
        line = self.proc.stdout.readline() if self.proc.stdout else b""
        if not line.strip():
            self.stop()
            raise RuntimeError(f"{self.what} did not start")
        self.port = int(line)

    def stop(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(self.stop_signal)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.proc = None

    def call(self, path: str, data: Any = None, timeout: float = 30) -> Any:
        """``GET path`` (``POST`` with ``data`` as JSON) and its JSON answer."""
        body = None if data is None else json.dumps(data).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=body,
                                     method="GET" if data is None else "POST")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def serve_until_orphaned(runner: web.AppRunner, port: int,
                               on_port: Callable[[int], None] | None = None,
                               every: float = 1.0) -> None:
    """Listen on 127.0.0.1:``port`` (``on_port`` learns the port first), print the port, and
    serve until the process that started this server is gone (a test killed before its
    ``stop()``): a loopback server never outlives its test run."""
    parent = os.getppid()
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    await web.SockSite(runner, sock, backlog=1024).start()
    bound = sock.getsockname()[1]
    if on_port is not None:
        on_port(bound)
    print(bound, flush=True)
    while os.getppid() == parent:
        await asyncio.sleep(every)
