"""Retry-After: the provider's own wait, read from an error, and the hold-off it sets.

``retry_after(exc)`` finds the wait an error carries: ``exc.retry_after`` (seconds), or the
``Retry-After`` / ``retry-after-ms`` header of ``exc.response`` (seconds or an HTTP date), as
the ``openai``, ``httpx`` and ``requests`` exceptions carry it. ``HoldOff`` is a node's "no
new call before" time, shared through the limits backend (every process of the machine;
the cluster on ``distributed``), read at most every ``REFRESH`` seconds per process.
"""

from __future__ import annotations

import email.utils
import math
import os
import time
from typing import Any

from hypernodes_dist.policies.backend import SharedValue
from hypernodes_dist.policies.limits import shared

__all__ = ["retry_after", "HoldOff", "holdoff_for", "REFRESH", "MAX_WAIT"]

REFRESH = 0.1  # seconds a process trusts the hold-off it last read
MAX_WAIT = 3600.0  # a Retry-After further out than this is taken as this


def retry_after(exc: BaseException) -> float | None:
    """Seconds the error says to wait before trying again, or ``None``."""
    value = getattr(exc, "retry_after", None)
    seconds = _seconds(value) if value is not None else None
    if seconds is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
        if headers is not None:
            seconds = _from_headers(headers)
    if seconds is None:
        return None
    return min(max(seconds, 0.0), MAX_WAIT)


def _from_headers(headers: Any) -> float | None:
    try:
        ms = headers.get("retry-after-ms") or headers.get("Retry-After-Ms")
        if ms is not None:
            found = _seconds(ms)
            if found is not None:
                return found / 1000.0
        value = headers.get("retry-after") or headers.get("Retry-After")
    except Exception:  # headers of an unknown kind: no wait given
        return None
    return None if value is None else _seconds(value)


def _seconds(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str):
        return None
    try:
        return float(value.strip())
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - time.time()


class HoldOff:
    """Node ``name``'s hold-off: no new call starts before ``until()`` (wall clock)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.local_until = 0.0
        self.read_at = -math.inf

    def _shared(self) -> SharedValue:
        return shared(f"holdoff-{self.name}")

    def until(self) -> float:
        """The hold-off's end (0.0 or a past time: none)."""
        now = time.monotonic()
        if now - self.read_at >= REFRESH:
            self.read_at = now
            shared = self._shared().get()
            if isinstance(shared, (int, float)) and shared > self.local_until:
                self.local_until = float(shared)
        return self.local_until

    def extend(self, seconds: float) -> None:
        """No new call of the node for ``seconds`` from now (everywhere the backend reaches)."""
        end = time.time() + seconds
        if end <= self.local_until:
            return
        self.local_until = end
        self._shared().update(lambda old: max(float(old or 0.0), end))


_HOLDOFFS: dict[str, HoldOff] = {}


def holdoff_for(name: str) -> HoldOff:
    """This process's ``HoldOff`` of node ``name`` (one per node: what it last read is
    shared by every guard of the node, so a guard made per call reads the store at most
    every ``REFRESH`` seconds too)."""
    found = _HOLDOFFS.get(name)
    if found is None:
        found = _HOLDOFFS.setdefault(name, HoldOff(name))
    return found


if hasattr(os, "register_at_fork"):  # a forked child reads the store afresh
    os.register_at_fork(after_in_child=_HOLDOFFS.clear)
