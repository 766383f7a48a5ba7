"""``MISSING``: the one marker of an absent value, below every module that uses it.

An output a failed or skipped item does not have, a cache miss, a value not computed yet.
It is falsy, compared with ``is``, and pickles to itself (``__reduce__`` names it), so a
result shipped from a worker process still holds ``MISSING`` where it had it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MISSING"]


class _Missing:
    """The type of ``MISSING`` (one instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self) -> str:
        return "MISSING"  # pickled by name: this module's ``MISSING``

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()
