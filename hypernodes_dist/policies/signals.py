"""The provider's signals an error carries, read as openai-python, fenic and LiteLLM do.

- ``retry_after(exc, most)``: the wait the provider asks for -- ``exc.retry_after``
  (seconds), or ``exc.response.headers``' ``retry-after-ms`` / ``Retry-After`` (seconds or
  an HTTP date), as the ``openai``, ``httpx`` and ``requests`` exceptions carry them. A
  value that is not a plain non-negative number or an HTTP date (``"abc"``, ``"inf"``,
  ``"1e1000"``, ``"-5"``), or is longer than ``most`` seconds (a node's
  ``max_retry_after``), is ignored, never clamped: the node's own back-off applies.
- ``should_retry(exc)``: the ``x-should-retry`` header, ``True``/``False``, or ``None``.
- ``quota_exhausted(exc)``: a 429 for exhausted quota or a spend cap
  (``insufficient_quota`` in the error body's ``code`` or ``type``): waiting does not help.
- ``final(exc)``: an error no retry, hold-off or back-off helps (exhausted quota, a spent
  budget, a call larger than a whole window's limit): the item fails at once.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import math
import re
import time
from collections.abc import Mapping
from typing import Any

from hypernodes_dist.errors import BudgetExceededError, WaitingForBatch, WindowLimitError

__all__ = ["retry_after", "should_retry", "quota_exhausted", "final", "MAX_RETRY_AFTER",
           "QUOTA_CODES"]

MAX_RETRY_AFTER = 3600.0  # a node's default max_retry_after, seconds
QUOTA_CODES = frozenset({"insufficient_quota"})
_NUMBER = re.compile(r"^\s*\d{1,12}(?:\.\d{1,9})?\s*$")  # delay-seconds; fractions as openai reads


def retry_after(exc: BaseException, most: float = MAX_RETRY_AFTER) -> float | None:
    """Seconds the error says to wait before trying again; ``None`` when it says nothing
    usable (absent, garbage, negative, or over ``most``)."""
    value = getattr(exc, "retry_after", None)
    seconds = _seconds(value) if value is not None else None
    if seconds is None:
        seconds = _from_headers(_headers(exc))
    if seconds is None or seconds > most:
        return None
    return seconds


def should_retry(exc: BaseException) -> bool | None:
    """The provider's ``x-should-retry`` (``None``: not sent, or neither true nor false)."""
    value = _header(_headers(exc), "x-should-retry")
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    value = str(value).strip().lower() if value is not None else ""
    return True if value == "true" else False if value == "false" else None


def quota_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` is a refusal for exhausted quota or a spend cap (no retry helps)."""
    for name in ("code", "type"):
        if getattr(exc, name, None) in QUOTA_CODES:
            return True
    if _quota_in(getattr(exc, "body", None)):
        return True
    response = getattr(exc, "response", None)
    if getattr(response, "status_code", None) != 429:
        return False
    try:  # an httpx / requests error: the body the response already read
        content = getattr(response, "content", None)
    except Exception:  # a streamed body not read
        return False
    if not isinstance(content, (bytes, str)) or "insufficient_quota" not in (
            content.decode("utf-8", "replace") if isinstance(content, bytes) else content):
        return False
    try:
        return _quota_in(json.loads(content))
    except ValueError:
        return False


def final(exc: BaseException) -> bool:
    """Whether waiting and trying again cannot help ``exc`` (no retry, no hold-off, no
    back-off of the node's concurrency)."""
    return (isinstance(exc, (BudgetExceededError, WindowLimitError, WaitingForBatch))
            or quota_exhausted(exc))


def _quota_in(body: Any) -> bool:
    if not isinstance(body, Mapping):
        return False
    if body.get("code") in QUOTA_CODES or body.get("type") in QUOTA_CODES:
        return True
    return _quota_in(body.get("error"))


def _headers(exc: BaseException) -> Any:
    return getattr(getattr(exc, "response", None), "headers", None)


def _header(headers: Any, name: str) -> Any:
    if headers is None:
        return None
    try:  # httpx / requests headers are case-insensitive; a plain dict may not be
        value = headers.get(name)
        return value if value is not None else headers.get(name.title())
    except Exception:  # headers of an unknown kind: nothing sent
        return None


def _from_headers(headers: Any) -> float | None:
    ms = _header(headers, "retry-after-ms")
    if ms is not None:
        found = _seconds(ms, date=False)
        if found is not None:
            return found / 1000.0
    value = _header(headers, "retry-after")
    return None if value is None else _seconds(value)


def _seconds(value: Any, date: bool = True) -> float | None:
    """A non-negative finite number of seconds, or an HTTP date's distance from now."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) and value >= 0 else None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str):
        return None
    if _NUMBER.match(value):
        return float(value)
    if not date:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # "-0000": RFC 7231 dates are GMT
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(when.timestamp() - time.time(), 0.0)
