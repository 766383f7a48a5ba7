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
import json.encoder
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["Canonical", "canonical_body", "canonical_json", "digest_of", "digest_for",
           "request_digest", "map_tag", "custom_id", "file_tag"]


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)


def _reused() -> Callable[[Any], str]:
    """``_CANONICAL.encode`` for a dict, through one C encoder made once (``encode`` makes
    one a call: ~60% of its time on a request's body). No circular check (no markers: the
    one encoder is shared by threads); a cycle raises ``RecursionError``, as ``plain`` of
    it does first on the fast paths. Without the C encoder: ``_CANONICAL.encode``."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _CANONICAL.encode
    e = _CANONICAL

    def fail(value: Any) -> Any:
        return e.default(value)  # the encoder's own TypeError

    encode = make(None, fail, json.encoder.encode_basestring, None, e.key_separator,
                  e.item_separator, True, e.skipkeys, e.allow_nan)
    return lambda body: "".join(encode(body, 0))


_ENCODE = _reused()


def canonical_json(body: Mapping[str, Any]) -> bytes:
    """A dict's canonical JSON bytes (sorted keys, no spaces, UTF-8; ``ValueError`` for NaN
    or a lone surrogate, ``TypeError`` for a value JSON has not)."""
    return _ENCODE(body).encode()


class Canonical(dict[str, Any]):
    """A request body read back with its canonical bytes (``canonical``), so that they are
    not computed again; not to be changed. ``named``: ``(endpoint, digest)`` once its
    digest is computed (the request log reuses it)."""

    __slots__ = ("canonical", "named")

    def __init__(self, body: Mapping[str, Any], canonical: bytes,
                 named: tuple[str, str] | None = None) -> None:
        super().__init__(body)
        self.canonical, self.named = canonical, named


def canonical_body(body: Mapping[str, Any]) -> bytes:
    """The body as canonical JSON bytes (sorted keys, no spaces, UTF-8)."""
    if type(body) is Canonical:
        return body.canonical
    if type(body) is dict:
        return _ENCODE(body).encode()
    return _CANONICAL.encode(body).encode()


def digest_of(endpoint: str, canonical: bytes) -> str:
    """32 hex digits naming a request from its canonical body: BLAKE2b-128 of the endpoint,
    a newline and the body, from a copy of the endpoint's hash state (made once: half the
    cost of hashing the three joined anew)."""
    seed = _SEEDS.get(endpoint)
    if seed is None:
        seed = hashlib.blake2b(endpoint.encode() + b"\n", digest_size=16)
        if len(_SEEDS) < 64:  # a map's few endpoints
            _SEEDS[endpoint] = seed
    h = seed.copy()
    h.update(canonical)
    return h.hexdigest()


_SEEDS: dict[str, Any] = {}  # endpoint -> the hash state after "endpoint\n" (never updated)


def digest_for(endpoint: str, body: Mapping[str, Any]) -> str:
    """``request_digest``, kept on a ``Canonical`` body (computed once per endpoint)."""
    if type(body) is not Canonical:
        return digest_of(endpoint, canonical_body(body))
    named = getattr(body, "named", None)  # unset on one built without __init__
    if named is None or named[0] != endpoint:
        named = body.named = (endpoint, digest_of(endpoint, body.canonical))
    return named[1]


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
