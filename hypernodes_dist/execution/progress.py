"""The progress channel: how many rows of each batch are finished, from where rows run to
the driver, while they run.

One small protocol, one implementation per transport. Where rows run, the executor calls
``ticker(settings.progress).tick(offset, done, metered)``: ``done`` rows of the batch
starting at item ``offset`` are finished, and its calls metered ``metered`` so far
(``{quantity: amount}``, or ``None``: unchanged); both cumulative, so a lost or late
message is harmless. A ``Ticker`` (one per process and channel) keeps the latest per batch
and hands them to the channel's ``send`` at most every ``INTERVAL`` seconds (coalesced; the
last ones go out on a timer, so a batch that goes quiet still reports). The driver's side
receives ``{offset: (done, metered)}`` dicts in any thread (``run/progress.py`` reconciles
them with the exact counts that come with each batch or file).

Transports (a channel is picklable: it travels in ``BatchSettings``):

- ``LocalChannel``: in this process (the local engine, threads): ``send`` calls the
  receiver; unpickled in another process it sends nothing;
- ``engines/channels.py``: machine-wide (worker processes on this machine);
- an engine's own means on a cluster (Dask worker events, a Ray actor), in its plugin.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Optional

from hypernodes_dist.perprocess import Memo, Table

__all__ = ["ProgressChannel", "LocalChannel", "Ticker", "ticker", "Receive", "Updates",
           "INTERVAL"]

INTERVAL = 0.25  # a process sends at most 4 updates a second per map
# batch offset -> (rows done, what its calls metered so far or None: unchanged)
Updates = dict[int, tuple[int, Optional[dict[str, float]]]]
Receive = Callable[[Updates], None]


class ProgressChannel:
    """One map's channel (the base class is the protocol): ``send`` runs where rows run,
    ``close`` in the driver when the map ends."""

    def __init__(self) -> None:
        self.key = uuid.uuid4().hex

    def send(self, updates: Updates) -> None:
        """Hand ``{batch offset: (rows done, metered)}`` to the driver (never raises,
        never blocks)."""
        raise NotImplementedError

    def close(self) -> None:
        """The driver's side: stop receiving (idempotent)."""


_LOCAL: Table[str, Receive] = Table("execution.progress.local")  # the driver's receivers


class LocalChannel(ProgressChannel):
    """In this process: ``send`` is the driver's receiver, called in the sending thread."""

    def __init__(self, receive: Receive) -> None:
        super().__init__()
        _LOCAL[self.key] = receive

    def send(self, updates: Updates) -> None:
        receive = _LOCAL.get(self.key)
        if receive is not None:
            receive(updates)

    def close(self) -> None:
        _LOCAL.pop(self.key, None)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_local_channel, (self.key,))


def _local_channel(key: str) -> LocalChannel:
    """A ``LocalChannel`` unpickled: the same receiver in this process, none elsewhere."""
    channel = LocalChannel.__new__(LocalChannel)
    channel.key = key
    return channel


class Ticker:
    """One process's side of a channel: the latest count per batch, sent at most every
    ``INTERVAL`` seconds (what arrives in between is coalesced)."""

    def __init__(self, channel: ProgressChannel) -> None:
        self.channel = channel
        self._pending: Updates = {}
        self._last = 0.0
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def tick(self, offset: int, done: int, metered: Mapping[str, float] | None = None) -> None:
        """``done`` rows of the batch starting at item ``offset`` are finished; its calls
        metered ``metered`` so far (``None``: as last said)."""
        with self._lock:
            if metered is None:
                metered = self._pending.get(offset, (0, None))[1]
            else:
                metered = dict(metered)
            self._pending[offset] = (done, metered)
            wait = self._last + INTERVAL - time.monotonic()
            if wait > 0:
                if self._timer is None:
                    self._timer = threading.Timer(wait, self.flush)
                    self._timer.daemon = True
                    self._timer.start()
                return
            updates = self._take()
        self._send(updates)

    def flush(self) -> None:
        """Send what is pending now."""
        with self._lock:
            updates = self._take()
        self._send(updates)

    def _take(self) -> Updates:
        updates, self._pending = self._pending, {}
        self._last = time.monotonic()
        self._timer = None
        return updates

    def _send(self, updates: Updates) -> None:
        if updates:
            try:
                self.channel.send(updates)
            except Exception:  # noqa: BLE001 -- progress never fails a row
                pass


_KEEP = 8  # the tickers of this many recent maps are kept per process
_TICKERS: Memo[Ticker] = Memo("execution.progress.tickers", keep=_KEEP)


def ticker(channel: ProgressChannel) -> Ticker:
    """This process's ``Ticker`` of ``channel`` (one per process and map)."""
    return _TICKERS.get(channel.key, lambda: Ticker(channel))
