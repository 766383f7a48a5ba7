"""Limits a provider states in its responses, learned for a resource that declares none.

``watch(client, key)`` installs, once, a response event hook on the HTTP layer of the
object a resource built: the ``httpx`` client an ``openai`` / ``anthropic`` client holds
(``client._client``), or an ``httpx.Client`` / ``AsyncClient`` itself, through httpx's
public ``event_hooks``. The hook sees every response, successful ones and 429s alike, and
reads OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` and Anthropic's
``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}``. What it reads is this
process's ``Learned`` for the resource and goes to the limits backend (``shared``, at
most every ``PUBLISH`` seconds), so every process paces by the limits any of them saw.

A limit's period is read from the headers as the provider refills: ``limit - remaining``
come back within ``reset`` seconds, so the period is ``limit * reset / (limit - remaining)``
(60 s for OpenAI's and Anthropic's per-minute limits; 60 s when nothing is missing; never
more: ``period_of``), kept with the limit (``[limit, remaining, reset, period]``), and a
limit of ``N`` is paced as a token bucket refilled continuously at ``N/period`` a second
(``gates/learned.py``).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

from hypernodes_dist.perprocess import Memo
from hypernodes_dist.policies.limits import shared

__all__ = ["Learned", "learned_for", "watch", "read_headers", "period_of", "PUBLISH"]

PUBLISH = 0.5  # seconds between two writes (or reads) of a resource's learned limits
PERIOD = 60.0  # the providers' limits are per minute
TICK = 0.001  # seconds: the resolution of a stated reset

_OPENAI = {"requests": ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
                        "x-ratelimit-reset-requests"),
           "tokens": ("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens",
                      "x-ratelimit-reset-tokens")}
_ANTHROPIC = {q: tuple(f"anthropic-ratelimit-{q}-{part}" for part in ("limit", "remaining",
                                                                      "reset"))
              for q in ("requests", "tokens")}
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(text: str) -> float | None:
    """OpenAI's ``1s``, ``6m0s``, ``20ms``, ``59.000s``; Anthropic's RFC 3339 time."""
    text = text.strip()
    total, number = 0.0, ""
    i = 0
    while i < len(text):
        c = text[i]
        if c.isdigit() or c == ".":
            number += c
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else c
        if unit not in _UNITS or not number:
            return _until(text)
        total += float(number) * _UNITS[unit]
        number, i = "", i + len(unit)
    return total if not number else _until(text)


def _until(text: str) -> float | None:
    try:
        return max(0.0, datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
                   - time.time())
    except ValueError:
        return None


def read_headers(headers: Any) -> dict[str, list[float | None]]:
    """``{"requests"|"tokens": [limit, remaining, reset seconds]}`` stated in ``headers``."""
    found: dict[str, list[float | None]] = {}
    for names in (_OPENAI, _ANTHROPIC):
        for quantity, (limit, remaining, reset) in names.items():
            raw = headers.get(limit)
            try:
                value = float(raw) if raw is not None else 0.0
            except ValueError:
                continue
            if value <= 0:
                continue
            left, wait = headers.get(remaining), headers.get(reset)
            try:
                left_n = float(left) if left is not None else None
            except ValueError:
                left_n = None
            found[quantity] = [value, left_n, _duration(wait) if wait else None]
    return found


def period_of(limit: float, remaining: float | None, reset: float | None,
              known: float | None = None) -> float:
    """The period of a limit (seconds), as its refill tells it (two significant digits;
    within 10% of a minute: a minute). The reset is taken a ``TICK`` longer (it is read to
    the ms: a short one errs on the slow side). Never over a minute (the providers' limits
    are per minute; a provider whose ``reset`` is a window's end, not the refill's, would
    read as a period of up to ``limit`` windows and pace calls to a crawl). A zero reset or
    nothing used tells nothing: the period ``known`` from an earlier response, else a
    minute."""
    if remaining is None or reset is None or reset <= 0 or limit - remaining < 1:
        return known or PERIOD
    period = limit * (reset + TICK) / (limit - remaining)
    if abs(period - PERIOD) <= 0.1 * PERIOD:
        return PERIOD
    return float(f"{min(max(period, 0.01), PERIOD):.2g}")


class Learned:
    """What this process knows of one resource's provider limits."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.lock = threading.Lock()
        self.state: dict[str, Any] | None = None  # {"requests": [limit, remaining, reset], ...}
        self.published = self.read = 0.0  # monotonic times of the last write / read
        self.hooked = False  # a client of the resource carries the hook
        self.probing = False  # one call of this process is out to learn the limits

    def saw(self, headers: Any) -> None:
        """The hook: a response's headers."""
        found = read_headers(headers)
        if not found:
            return
        now = time.monotonic()
        with self.lock:
            old = self.state or {}
            for quantity, seen in found.items():  # + the period, kept while resets are coarse
                known = old.get(quantity)
                limit, remaining, reset = seen[:3]  # the limit is always stated (> 0)
                seen.append(period_of(limit or 0.0, remaining, reset,
                                      known[3] if known and len(known) > 3 else None))
            self.state = state = {**old, **found, "at": time.time()}
            publish = now - self.published >= PUBLISH
            if publish:
                self.published = now
        if publish:
            shared(self.key + ":learned").update(lambda _old: state)

    def current(self) -> dict[str, Any] | None:
        """The learned limits (this process's, or the backend's every ``PUBLISH`` s)."""
        now = time.monotonic()
        if now - self.read < PUBLISH:
            return self.state
        with self.lock:
            self.read = now
        found = shared(self.key + ":learned").get()
        with self.lock:
            if found and (self.state is None or found.get("at", 0) > self.state.get("at", 0)):
                self.state = found
            return self.state


_LEARNED: Memo[Learned] = Memo("policies.learned")  # a forked child learns anew


def learned_for(key: str) -> Learned:
    return _LEARNED.get(key, lambda: Learned(key))


def watch(obj: Any, key: str) -> None:
    """Hook the HTTP layer of ``obj`` (an ``openai`` / ``anthropic`` client or an ``httpx``
    client) so its responses teach resource ``key``'s limits; once per client."""
    http = getattr(obj, "_client", obj)  # openai / anthropic clients hold an httpx client
    hooks = getattr(http, "event_hooks", None)
    if not isinstance(hooks, dict) or key in (getattr(http, "_hn_learns", None) or ()):
        return
    learned = learned_for(key)
    if hasattr(http, "aclose"):  # an httpx.AsyncClient: its hooks are awaited
        async def hook(response: Any) -> None:
            learned.saw(response.headers)
    else:
        def hook(response: Any) -> None:  # type: ignore[misc]  # the sync variant: httpx.Client calls its hooks
            learned.saw(response.headers)
    hooks = dict(hooks)
    hooks["response"] = [*hooks.get("response", []), hook]
    http.event_hooks = hooks
    http._hn_learns = {*(getattr(http, "_hn_learns", None) or ()), key}
    learned.hooked = True

