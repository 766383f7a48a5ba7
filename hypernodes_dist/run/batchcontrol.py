"""A map's provider batches from outside the map: their state, cancelling them, and
resubmitting the requests of batches the provider no longer knows.

A map keeps its batches in ``into/_hn_batches/`` (without ``into=``, in the cache's folder:
``_hn_batches/<map tag>/``), one ledger per resource (``ledgers/<resource>/ledger.jsonl``).
Each function takes any folder above ledgers — the map's ``into`` folder, its batch
folder, or a cache folder (then every map in it) — and works from the ledgers:

- ``batch_status(path)``: per ledger, its files by state, the batches at the provider and
  the lost ones (no provider call).
- ``cancel_batches(path, clients=None)``: each batch still at the provider is cancelled (a
  ``cancel`` event in the ledger first). A map waiting on them returns with its rows
  pending; the lines the provider did not answer are not counted against the node's
  retries, and a rerun of the map submits them again.
- ``resubmit_lost_batches(path)``: the user says so: the requests of batches the provider
  answered 404 for (another API key, deleted) are submitted again by the next run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypernodes_dist.batchapi import BatchNotFoundError, transport_for
from hypernodes_dist.batchapi.store import FileState, Ledger
from hypernodes_dist.execution.syncio import run_sync

__all__ = ["LedgerStatus", "batch_status", "cancel_batches", "resubmit_lost_batches"]

Clients = Any  # one client, a mapping resource name -> client, or None (the environment's)


@dataclass
class LedgerStatus:
    """One resource's batches of a map."""

    ledger: str                       # the ledger's path
    resource: str                     # the resource whose calls it batches
    provider: str                     # "openai", "anthropic" ("" before any batch)
    files: dict[str, int] = field(default_factory=dict)  # by state: submitted, done...
    running: list[str] = field(default_factory=list)     # batch ids at the provider
    lost: list[str] = field(default_factory=list)        # batch ids it answered 404 for


def _ledgers(path: str | os.PathLike[str]) -> list[Ledger]:
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{str(root)!r} is not a folder: give a map's into= folder, "
                                "its _hn_batches folder or its cache folder")
    return [Ledger(p.parent) for p in sorted(root.rglob("ledger.jsonl"))]


def _status(ledger: Ledger, files: dict[str, FileState]) -> LedgerStatus:
    out = LedgerStatus(str(ledger.path), ledger.folder.name,
                       next((f.provider for f in files.values() if f.provider), ""))
    for f in files.values():
        out.files[f.state] = out.files.get(f.state, 0) + 1
        if f.state == "submitted":
            out.running.append(str(f.batch_id))
        elif f.state == "lost":
            out.lost.append(str(f.batch_id))
    return out


def batch_status(path: str | os.PathLike[str]) -> list[LedgerStatus]:
    """The batches of the map(s) under ``path``, one entry per ledger (no provider call)."""
    return [_status(ledger, ledger.files()) for ledger in _ledgers(path)]


def cancel_batches(path: str | os.PathLike[str], clients: Clients = None) -> list[str]:
    """Cancel every batch of the map(s) under ``path`` still at the provider; the ids of
    the batches cancelled. ``clients``: the client to cancel with (``openai``/``anthropic``,
    sync or async), a mapping of resource name to client, or None for the clients the
    environment configures (``OPENAI_API_KEY``/``OPENAI_BASE_URL``,
    ``ANTHROPIC_API_KEY``/``ANTHROPIC_BASE_URL``)."""
    cancelled: list[str] = []
    for ledger in _ledgers(path):
        files = ledger.files()
        live = [f for f in files.values() if f.state == "submitted"]
        if not live:
            continue
        status = _status(ledger, files)
        client = _client_for(clients, status.resource, status.provider)
        if client is None:
            continue
        transport = transport_for(client, "", f"resource {status.resource!r}")
        cancelled += run_sync(_cancel(ledger, transport, live))
    return cancelled


async def _cancel(ledger: Ledger, transport: Any, live: list[FileState]) -> list[str]:
    out = []
    for f in live:
        ledger.write("cancel", fid=f.fid, batch=f.batch_id)
        try:
            await transport.cancel(str(f.batch_id))
        except BatchNotFoundError:
            continue
        out.append(str(f.batch_id))
    return out


def _client_for(clients: Clients, resource: str, provider: str) -> Any:
    """The client for a ledger: by resource name, the one client if its provider matches,
    or the environment's for the provider (None: none fits)."""
    if clients is None:
        return _client_from_env(provider)
    if isinstance(clients, Mapping):
        return clients.get(resource)
    mine = transport_for(clients, "", "cancel_batches(clients=...)").provider
    return clients if provider in ("", mine) else None


def _client_from_env(provider: str) -> Any:
    """``openai.OpenAI()`` / ``anthropic.Anthropic()`` as the environment configures them
    (loaded on use: either package is optional)."""
    try:
        if provider == "anthropic":
            import anthropic
            return anthropic.Anthropic()
        import openai
        return openai.OpenAI()
    except Exception as exc:  # no key in the environment, the package not installed
        raise ValueError(f"cannot build the {provider or 'openai'} client from the "
                         f"environment ({exc}); set its API key (and base URL) variables or "
                         "pass clients=") from exc


def resubmit_lost_batches(path: str | os.PathLike[str]) -> list[str]:
    """Let the next run of the map(s) under ``path`` submit again the requests of the
    batches the provider no longer knows (404); their ids."""
    forgotten: list[str] = []
    for ledger in _ledgers(path):
        for f in ledger.files().values():
            if f.state == "lost":
                ledger.write("forget", fid=f.fid, batch=f.batch_id)
                forgotten.append(str(f.batch_id))
    return forgotten
