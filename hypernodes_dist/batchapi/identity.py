"""A request's identity and its ``custom_id``: the same request gets the same id anywhere.

``custom_id = <map tag>_<request digest>``: the map tag (12 hex digits of a hash of the map's
id) lets a transport recognize a map's lines without metadata (Anthropic); the digest (32 hex
digits of BLAKE2b over the endpoint and the canonical JSON body: sorted keys, no spaces) makes
identical requests one line. 45 characters of ``[a-f0-9_]``: valid for every provider
(Anthropic: 1-64 of ``[a-zA-Z0-9_-]``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Canonical", "canonical_body", "digest_of", "request_digest", "map_tag", "custom_id", "file_tag"]


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)


class Canonical(dict[str, Any]):
    """A request body read back with its canonical bytes (``canonical``), so that they are
    not computed again; not to be changed."""

    __slots__ = ("canonical",)

    def __init__(self, body: Mapping[str, Any], canonical: bytes) -> None:
        super().__init__(body)
        self.canonical = canonical


def canonical_body(body: Mapping[str, Any]) -> bytes:
    """The body as canonical JSON bytes (sorted keys, no spaces, UTF-8)."""
    if type(body) is Canonical:
        return body.canonical
    return _CANONICAL.encode(body).encode()


def digest_of(endpoint: str, canonical: bytes) -> str:
    """32 hex digits naming a request from its canonical body."""
    return hashlib.blake2b(endpoint.encode() + b"\n" + canonical, digest_size=16).hexdigest()


def request_digest(endpoint: str, body: Mapping[str, Any]) -> str:
    """32 hex digits naming a request (endpoint + canonical body)."""
    return digest_of(endpoint, canonical_body(body))


def map_tag(map_id: str) -> str:
    """12 hex digits naming a map in its custom_ids."""
    return hashlib.blake2b(map_id.encode(), digest_size=6).hexdigest()


def custom_id(tag: str, endpoint: str, body: Mapping[str, Any]) -> str:
    """The custom_id of a request of the map tagged ``tag``."""
    return f"{tag}_{request_digest(endpoint, body)}"


def file_tag(custom_ids: Iterable[str]) -> str:
    """16 hex digits naming a file by its custom_ids (in order)."""
    joined = "".join([f"{cid}\n" for cid in custom_ids])  # one update, not one per line
    return hashlib.blake2b(joined.encode(), digest_size=8).hexdigest()
