"""The machine-wide progress channel: worker processes on this machine send their finished
row counts to the driver over loopback UDP (``execution/progress.py`` is the protocol).

The driver binds a socket on ``127.0.0.1`` (a free port) and reads it in a daemon thread;
each worker process sends from one socket of its own, never blocking: a datagram that
cannot be sent (the driver gone, a full buffer) is dropped, which costs nothing since
counts are cumulative and the exact counts come with each batch anyway. A datagram holds
the channel's token and the updates as JSON ``[[offset, done, metered or null], ...]``;
others are ignored.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

from hypernodes_dist.execution.progress import ProgressChannel, Receive, Updates
from hypernodes_dist.perprocess import Memo

__all__ = ["MachineChannel"]

_PER_DATAGRAM = 200  # updates per datagram, at most (well under 64 KB)
_SENDER: Memo[socket.socket] = Memo("engines.channels.sender")  # this process's socket


def _sender() -> socket.socket:
    return _SENDER.get("socket", _new_sender)


def _new_sender() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    return sock


class MachineChannel(ProgressChannel):
    """Counts from any process of this machine, received in a driver thread."""

    def __init__(self, receive: Receive) -> None:
        super().__init__()
        self.token = bytes.fromhex(self.key[:16])
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self.address = self._sock.getsockname()
        self._closed = False
        self._thread = threading.Thread(target=self._read, args=(receive,), daemon=True,
                                        name="hn-progress")
        self._thread.start()

    def send(self, updates: Updates) -> None:
        items = [[k, done, metered] for k, (done, metered) in updates.items()]
        for a in range(0, len(items), _PER_DATAGRAM):
            data = json.dumps(items[a:a + _PER_DATAGRAM], separators=(",", ":")).encode()
            try:
                _sender().sendto(self.token + data, self.address)
            except OSError:
                return

    def _read(self, receive: Receive) -> None:
        sock, token = self._sock, self.token
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                return
            if self._closed:
                return
            if data[:8] != token:
                continue
            try:
                items = json.loads(data[8:])
                updates = {int(k): (int(done), metered) for k, done, metered in items}
            except (ValueError, TypeError):
                continue
            receive(updates)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:  # wake the reader
            _sender().sendto(b"", self.address)
        except OSError:
            pass
        self._thread.join(timeout=1.0)
        self._sock.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key, "token": self.token, "address": self.address}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
