"""Object-store URIs for Daft's own readers and writers.

``pyarrow.fs`` takes an S3 endpoint, scheme, region and keys as query options of the URI
(``s3://bucket/prefix?endpoint_override=host:9000&scheme=http&region=eu-west-1``), which is
how a dataset map's ``source=``/``into=`` name them. Daft takes them as an ``IOConfig``
instead, and reads a query string as part of the object key; ``io_config`` translates
one into the other. Credentials not in the URI come from the environment, as in pyarrow.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from daft.io import IOConfig, S3Config

__all__ = ["io_config"]

_S3_KEYS = {"region": "region_name", "access_key": "key_id", "secret_key": "access_key",
            "session_token": "session_token"}


def io_config(location: str) -> IOConfig | None:
    """The ``IOConfig`` for the S3 options in ``location``'s query (``None``: none given)."""
    parts = urlsplit(location)
    if parts.scheme != "s3" or not parts.query:
        return None
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    config: dict[str, Any] = {new: options[old] for old, new in _S3_KEYS.items()
                              if old in options}
    scheme = options.get("scheme", "https")
    endpoint = options.get("endpoint_override")
    if endpoint is not None:
        config["endpoint_url"] = endpoint if "://" in endpoint else f"{scheme}://{endpoint}"
    if scheme == "http":
        config["use_ssl"] = False
    return IOConfig(s3=S3Config(**config)) if config else None
