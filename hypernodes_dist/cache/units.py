"""Sizes and ages as people write them: ``size_limit="10GB"``, ``prune --older-than 7d``."""

from __future__ import annotations

import re

__all__ = ["parse_age", "parse_size"]

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_NUMBER = r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*"


def parse_size(value: int | str | None, what: str = "size_limit") -> int | None:
    """Bytes of ``value``: an int, or a string such as ``"10GB"`` (10**9 bytes), ``"512MiB"``
    (2**29), ``"1.5g"``; ``None`` stays ``None`` (no limit). Raises ``ValueError`` naming
    ``what`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number of bytes or a string like '10GB', got {value!r}")
    if isinstance(value, int):
        number = value
    else:
        found = re.fullmatch(_NUMBER, str(value))
        unit = found.group(2).lower() if found else None
        if found is None or unit not in _SIZE_UNITS:
            raise ValueError(f"{what}={value!r} is not a size: write bytes as an int or a "
                             "string like '500MB', '10GB' or '2GiB'")
        number = int(float(found.group(1)) * _SIZE_UNITS[unit])
    if number <= 0:
        raise ValueError(f"{what} must be positive, got {value!r}")
    return number


def parse_age(value: float | str, what: str = "--older-than") -> float:
    """Seconds of ``value``: a number of seconds or a string such as ``"7d"``, ``"12h"``,
    ``"30m"``, ``"45s"``, ``"2w"``. Raises ``ValueError`` naming ``what`` otherwise."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        found = re.fullmatch(_NUMBER, str(value))
        unit = (found.group(2).lower() or "s") if found else None
        if found is None or unit not in _AGE_UNITS:
            raise ValueError(f"{what} {value!r} is not an age: write a number with a unit "
                             "s, m, h, d or w, such as '7d' or '12h'")
        seconds = float(found.group(1)) * _AGE_UNITS[unit]
    if seconds < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return seconds
