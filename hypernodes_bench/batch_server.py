"""A loopback fake of the providers' Batch APIs (OpenAI Files + Batches, Anthropic Message
Batches) and their online endpoints, for tests, benchmarks and examples (no network).

``BatchServer`` starts ``python -m hypernodes_bench.batch_server`` as a subprocess (aiohttp)
on 127.0.0.1 and stops it on exit; the REAL ``openai`` and ``anthropic`` clients work
against it unchanged:

    with BatchServer(delay=0.5) as server:
        oa = openai.OpenAI(base_url=server.base_url, api_key="x")
        an = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="x")
        server.stats(); server.counts(); server.configure(queue_tokens=1000); server.reset()

OpenAI: ``POST /v1/files`` (multipart, streamed to disk), ``GET|DELETE /v1/files/{id}``,
``GET /v1/files/{id}/content``, ``POST /v1/batches``, ``GET /v1/batches/{id}``,
``GET /v1/batches?limit=&after=`` (newest first), ``POST /v1/batches/{id}/cancel``; online
``POST /v1/chat/completions``, ``/v1/embeddings``, ``/v1/responses``. Anthropic:
``POST|GET /v1/messages/batches``, ``GET|DELETE /v1/messages/batches/{id}``,
``GET .../{id}/results`` (JSONL), ``POST .../{id}/cancel``; online ``POST /v1/messages``.
A batch answers exactly what the online endpoint answers for the same body
(``batch_answers``); output lines come in a shuffled order.

Knobs (``BatchServer(**config)``, ``configure(**config)``): ``delay`` (seconds from
in_progress to completion; a batch cancelled or expired midway keeps the answers of the
first ``elapsed/delay`` of its lines), ``validate_delay``, ``expire_after`` (a batch still
running then expires), ``queue_tokens`` (OpenAI's enqueued-token limit per model: a batch
over it is accepted, then ``failed`` with ``token_limit_exceeded``) and ``queue_refuse``
(a gateway: refused at create with 429 instead), ``fail_batches`` (the next N OpenAI batches
fail validation as a whole), ``max_lines``/``max_bytes``/``max_embedding_inputs`` (OpenAI
per file: failed validation with ``errors.data[]``; so do ``duplicate_custom_id``,
``mismatched_model``, ``mismatched_endpoint``, ``invalid_json``),
``anthropic_max_requests``/``anthropic_max_bytes`` (400 / 413 at create),
``price_online``/``price_batch`` (per token); the online endpoints' ``rpm``/``tpm`` over
``window_seconds`` (429 with ``retry-after`` and OpenAI's ``x-ratelimit-*`` headers past
them, as ``llm_server``) and ``latency`` (seconds an online answer takes). Markers in a prompt choose a line's fate
(``batch_answers``). ``stats()`` counts requests, lines by outcome, tokens and cost;
``counts()`` gives, per ``request_key``, ``[received, answered]`` over both paths (answered:
a 2xx or a 4xx other than 429 — what the client keeps).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aiohttp import web

from hypernodes_bench.batch_answers import (
    COMPACT,
    answer,
    anthropic_error,
    key_int,
    marker_fate,
    openai_error,
    tokens,
)
from hypernodes_bench.llm_server import Window

__all__ = ["BatchServer", "DEFAULTS"]

DEFAULTS: dict[str, Any] = {
    "delay": 0.0, "validate_delay": 0.0, "expire_after": None, "queue_tokens": None,
    "queue_refuse": False, "fail_batches": 0, "max_lines": 50_000, "max_bytes": 200 * 2**20,
    "max_embedding_inputs": 50_000, "anthropic_max_requests": 100_000,
    "anthropic_max_bytes": 256 * 2**20, "price_online": 1e-6, "price_batch": 5e-7,
    "rpm": None, "tpm": None, "window_seconds": 60.0, "latency": 0.0,
}
OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses")
RUNNING = ("validating", "in_progress", "finalizing", "cancelling")
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_STAT_NAMES = ("files", "file_bytes", "files_deleted", "batches", "batches_failed",
               "queue_failed", "queue_refused", "batch_lines", "lines_succeeded",
               "lines_errored", "lines_expired", "lines_cancelled", "online_requests",
               "online_ok", "online_errors", "online_rate_limited", "tokens_online",
               "tokens_batch")


@dataclass
class FileRec:
    id: str
    path: Path
    filename: str
    purpose: str
    bytes: int
    created_at: int


@dataclass
class BatchRec:
    """One batch of either provider, its input a JSONL file on disk."""

    id: str
    provider: str
    endpoint: str
    input_path: Path
    created_at: float
    input_file_id: str = ""
    metadata: dict[str, str] | None = None
    status: str = "validating"
    model: str | None = None
    total: int = 0
    tokens: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    keys: array = field(default_factory=lambda: array("Q"))
    fates: dict[int, tuple[str, int]] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None
    results_path: Path | None = None
    timer: asyncio.TimerHandle | None = None


@dataclass
class Scan:
    """What reading a batch's input found (a thread computes it; the loop applies it)."""

    total: int = 0
    tokens: int = 0
    model: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    keys: array = field(default_factory=lambda: array("Q"))
    fates: dict[int, tuple[str, int]] = field(default_factory=dict)
    seen: dict[int, int] = field(default_factory=dict)


class Shuffled:
    """Writes lines in blocks of 64, each block reversed: any order, streamed."""

    def __init__(self, path: Path) -> None:
        self.path, self.file, self.block, self.lines = path, path.open("wb"), [], 0

    def add(self, line: dict[str, Any]) -> None:
        self.block.append(COMPACT.encode(line).encode() + b"\n")
        self.lines += 1
        if len(self.block) == 64:
            self.flush()

    def flush(self) -> None:
        self.file.writelines(reversed(self.block))
        self.block = []

    def close(self) -> int:
        self.flush()
        self.file.close()
        if not self.lines:
            self.path.unlink()
        return self.lines


def _now_iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


class Store:
    """The server's state: files, batches, knobs and counters."""

    def __init__(self, folder: Path, config: dict[str, Any]) -> None:
        self.folder, self.config = folder, {**DEFAULTS, **config}
        self.files: dict[str, FileRec] = {}
        self.batches: dict[str, BatchRec] = {}
        self.order: dict[str, list[str]] = {"openai": [], "anthropic": []}
        self.next_id = 0
        self.port = 0
        self.window = self.new_window()
        self.reset()

    def new_window(self) -> Window:
        """The online endpoints' rate limits (``llm_server``'s sliding window)."""
        cfg = self.config
        return Window(cfg["rpm"], cfg["tpm"], float(cfg["window_seconds"]))

    def reset(self) -> None:
        self.stats: dict[str, float] = dict.fromkeys(_STAT_NAMES, 0)
        self.stats.update(cost_online=0.0, cost_batch=0.0)
        self.received: dict[int, int] = {}
        self.answered: dict[int, int] = {}

    def new_id(self, prefix: str) -> str:
        self.next_id += 1
        return f"{prefix}{self.next_id:012d}"

    def summary(self) -> dict[str, Any]:
        out = dict(self.stats)
        out["distinct"] = len(self.received)
        out["received_max"] = max(self.received.values(), default=0)
        out["answered_max"] = max(self.answered.values(), default=0)
        out["answered_twice"] = sum(1 for v in self.answered.values() if v > 1)
        out["batches_running"] = sum(1 for b in self.batches.values()
                                     if b.status in RUNNING or b.status == "canceling")
        return out

    def bill(self, tin: int, tout: int, path: str) -> None:
        self.stats[f"tokens_{path}"] += tin + tout
        self.stats[f"cost_{path}"] += (tin + tout) * self.config[f"price_{path}"]

    def enqueued(self, model: str | None, but: str) -> int:
        return sum(b.tokens for b in self.batches.values()
                   if b.provider == "openai" and b.model == model and b.id != but
                   and b.status in ("in_progress", "finalizing"))


def _json_line(raw: bytes) -> tuple[str | None, Any]:
    """(custom_id, request body) of an input line, OpenAI's or the stored Anthropic one."""
    obj = json.loads(raw)
    body = obj.get("body") if "body" in obj else obj.get("params")
    return obj.get("custom_id"), body


def scan(rec: BatchRec, cfg: dict[str, Any], received: dict[int, int]) -> Scan:
    """Read a batch's input: validate it (OpenAI's per-file rules), count its tokens, key
    its requests and pick the fate of the ones with markers."""
    out, ids, inputs = Scan(), set(), 0
    size = rec.input_path.stat().st_size
    if rec.provider == "openai" and size > cfg["max_bytes"]:
        out.errors.append(_err("file_too_large", f"The input file is {size} bytes, larger "
                               f"than the {cfg['max_bytes']} bytes a batch file may be."))
    with rec.input_path.open("rb") as f:
        for i, raw in enumerate(f):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                out.errors.append(_err("invalid_json", "This line is not valid JSON.", i + 1))
                continue
            body = obj.get("body") if rec.provider == "openai" else obj.get("params")
            if rec.provider == "openai":
                _check_line(rec, obj, body, ids, out, i + 1)
                if rec.endpoint.endswith("/embeddings"):
                    got = (body or {}).get("input", "")
                    inputs += len(got) if isinstance(got, list) else 1
            body = body if isinstance(body, dict) else {}
            key = key_int(_endpoint(rec), body)
            out.keys.append(key)
            seen = received.get(key, 0) + out.seen.get(key, 0) + 1
            out.seen[key] = out.seen.get(key, 0) + 1
            fate = marker_fate(raw, seen, batch=True)
            if fate is not None:
                out.fates[out.total] = fate
            tin, tout = tokens(_endpoint(rec), body)
            out.tokens += tin + tout
            out.total += 1
    _check_counts(rec, cfg, out, inputs)
    return out


def _check_line(rec: BatchRec, obj: dict[str, Any], body: Any, ids: set[str], out: Scan,
                line: int) -> None:
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        out.errors.append(_err("missing_custom_id", "Each line needs a custom_id.", line))
    elif cid in ids:
        out.errors.append(_err("duplicate_custom_id", f"The custom_id {cid!r} is used by "
                               "more than one request of this file.", line))
    ids.add(cid)
    if obj.get("method") != "POST" or obj.get("url") != rec.endpoint:
        out.errors.append(_err("mismatched_endpoint", f"The url {obj.get('url')!r} does not "
                               f"match the batch's endpoint {rec.endpoint!r}.", line))
    model = body.get("model") if isinstance(body, dict) else None
    if out.model is None:
        out.model = model
    elif model != out.model:
        out.errors.append(_err("mismatched_model", f"The model {model!r} of this line differs "
                               f"from {out.model!r}: one model per batch file.", line))


def _check_counts(rec: BatchRec, cfg: dict[str, Any], out: Scan, inputs: int) -> None:
    if rec.provider != "openai":
        return
    if out.total > cfg["max_lines"]:
        out.errors.append(_err("too_many_requests", f"The file has {out.total} requests, "
                               f"more than the {cfg['max_lines']} a batch may have."))
    if inputs > cfg["max_embedding_inputs"]:
        out.errors.append(_err("too_many_embedding_inputs", f"The file has {inputs} embedding "
                               f"inputs, more than {cfg['max_embedding_inputs']}."))
    if out.total == 0:
        out.errors.append(_err("empty_file", "The input file has no requests."))


def _err(code: str, message: str, line: int | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": None, "line": line}


def _endpoint(rec: BatchRec) -> str:
    return "/v1/messages" if rec.provider == "anthropic" else rec.endpoint


@dataclass
class Finished:
    """What writing a batch's results found (a thread computes it; the loop applies it)."""

    counts: dict[str, int] = field(default_factory=dict)
    answered: dict[int, int] = field(default_factory=dict)
    tin: int = 0
    tout: int = 0
    out_lines: int = 0
    err_lines: int = 0


def finish(rec: BatchRec, done: int, ending: str, folder: Path) -> Finished:
    """Write a batch's results: its first ``done`` lines answered (or as their fates say),
    the others ``ending`` ("expired" / "cancelled")."""
    res, openai = Finished(), rec.provider == "openai"
    res.counts = dict.fromkeys(("succeeded", "errored", "expired", "cancelled"), 0)
    outs = [Shuffled(folder / f"{rec.id}-{k}.jsonl") for k in ("output", "errors")]
    with rec.input_path.open("rb") as f:
        i = 0
        for raw in f:
            if not raw.strip():
                continue
            cid, body = _json_line(raw)
            fate = (ending, 0) if i >= done else rec.fates.get(i, ("ok", 200))
            kind = _kind(fate)
            res.counts[kind] += 1
            key = rec.keys[i]
            if kind == "succeeded" or (kind == "errored" and fate[1] < 500 and fate[1] != 429):
                res.answered[key] = res.answered.get(key, 0) + 1
            line = _result_line(rec, i, cid, body if isinstance(body, dict) else {}, fate, res)
            (outs[0] if kind == "succeeded" or not openai else outs[1]).add(line)
            i += 1
    res.out_lines, res.err_lines = outs[0].close(), outs[1].close()
    return res


def _kind(fate: tuple[str, int]) -> str:
    return {"ok": "succeeded", "status": "errored"}.get(fate[0], fate[0])


def _result_line(rec: BatchRec, i: int, cid: str | None, body: dict[str, Any],
                 fate: tuple[str, int], res: Finished) -> dict[str, Any]:
    key = f"{rec.keys[i]:016x}"
    if rec.provider == "anthropic":
        return {"custom_id": cid, "result": _anthropic_result(fate, body, key, res)}
    line: dict[str, Any] = {"id": f"batch_req_{rec.id[6:]}_{i}", "custom_id": cid,
                            "response": None, "error": None}
    if fate[0] in ("expired", "cancelled"):
        code, why = (("batch_expired", "This request could not be executed before the "
                      "completion window expired.") if fate[0] == "expired" else
                     ("batch_cancelled", "This request was not executed: the batch was "
                      "cancelled."))
        line["error"] = {"code": code, "message": why}
        return line
    status, out = fate[1], None
    if fate[0] == "ok":
        tin, tout = tokens(rec.endpoint, body)
        out = answer(rec.endpoint, body, key, (tin, tout))
        res.tin, res.tout = res.tin + tin, res.tout + tout
    else:
        out = openai_error(status, f"fake provider: status {status} for this request")
    line["response"] = {"status_code": status, "request_id": f"req_{key}", "body": out}
    return line


def _anthropic_result(fate: tuple[str, int], body: dict[str, Any], key: str,
                      res: Finished) -> dict[str, Any]:
    if fate[0] == "expired":
        return {"type": "expired"}
    if fate[0] == "cancelled":
        return {"type": "canceled"}
    if fate[0] == "status":
        return {"type": "errored",
                "error": anthropic_error(fate[1], f"fake provider: status {fate[1]}")}
    tin, tout = tokens("/v1/messages", body)
    res.tin, res.tout = res.tin + tin, res.tout + tout
    return {"type": "succeeded", "message": answer("/v1/messages", body, key, (tin, tout))}


class Batches:
    """The batches' life: validation, running, ending, results (both providers)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def add(self, rec: BatchRec) -> None:
        self.store.batches[rec.id] = rec
        self.store.order[rec.provider].append(rec.id)
        self.store.stats["batches"] += 1

    async def scan(self, rec: BatchRec) -> Scan:
        return await asyncio.to_thread(scan, rec, dict(self.store.config), self.store.received)

    async def validate(self, rec: BatchRec, scanned: Scan | None) -> None:
        """OpenAI: validating -> in_progress, or failed (whole-batch errors, queue limit)."""
        cfg = self.store.config
        await asyncio.sleep(cfg["validate_delay"])
        sc = scanned if scanned is not None else await self.scan(rec)
        rec.total, rec.tokens, rec.model = sc.total, sc.tokens, sc.model
        if rec.status != "validating":  # cancelled meanwhile: no line ran
            return None
        errors = sc.errors[:100]
        if not errors and cfg["fail_batches"] > 0:
            cfg["fail_batches"] -= 1
            errors = [_err("invalid_request", "fake provider: this batch failed validation "
                           "(injected by fail_batches)")]
        if not errors and self.over_queue(rec):
            self.store.stats["queue_failed"] += 1
            errors = [_err("token_limit_exceeded", self.queue_message(rec))]
        if errors:
            rec.status, rec.errors = "failed", errors
            rec.times["failed_at"] = time.time()
            self.store.stats["batches_failed"] += 1
            return None
        return self.run(rec, sc)

    def over_queue(self, rec: BatchRec) -> bool:
        limit = self.store.config["queue_tokens"]
        return limit is not None and self.store.enqueued(rec.model, rec.id) + rec.tokens > limit

    def queue_message(self, rec: BatchRec) -> str:
        return (f"Enqueued token limit reached for {rec.model} in organization org-fake. "
                f"Limit: {self.store.config['queue_tokens']} enqueued tokens. Please try "
                "submitting fewer tokens or wait until some of your in-progress batches "
                "have completed.")

    def run(self, rec: BatchRec, sc: Scan) -> None:
        """The batch is accepted: its lines count as received; it ends after ``delay``."""
        rec.total, rec.tokens, rec.model = sc.total, sc.tokens, sc.model
        rec.keys, rec.fates, rec.status = sc.keys, sc.fates, "in_progress"
        rec.times["in_progress_at"] = time.time()
        received = self.store.received
        for key, n in sc.seen.items():
            received[key] = received.get(key, 0) + n
        self.store.stats["batch_lines"] += sc.total
        cfg, loop = self.store.config, asyncio.get_running_loop()
        delay, expire = float(cfg["delay"]), cfg["expire_after"]
        if expire is not None and float(expire) < delay:
            rec.timer = loop.call_later(float(expire), self.end, rec, "expired")
        else:
            rec.timer = loop.call_later(delay, self.end, rec, "completed")

    def end(self, rec: BatchRec, ending: str) -> None:
        """Stop a batch ("completed", "expired", "cancelled") and write its results."""
        if rec.timer is not None:
            rec.timer.cancel()
        cfg = self.store.config
        delay, started = float(cfg["delay"]), rec.times.get("in_progress_at")
        if ending == "completed" or (started is not None and delay <= 0):
            done = rec.total
        elif started is None:
            done = 0
        else:  # the lines run so far: planned for an expiry, measured for a cancel
            elapsed = (float(cfg["expire_after"]) if ending == "expired"
                       else time.time() - started)
            done = math.floor(rec.total * min(1.0, elapsed / delay))
        if ending == "completed" and rec.provider == "openai":
            rec.status = "finalizing"
            rec.times["finalizing_at"] = time.time()
        self.spawn(self.write(rec, done, ending))

    async def write(self, rec: BatchRec, done: int, ending: str) -> None:
        tail = "cancelled" if ending == "cancelled" else "expired"
        res = await asyncio.to_thread(finish, rec, done, tail, self.store.folder)
        store, now = self.store, time.time()
        for key, n in res.answered.items():
            store.answered[key] = store.answered.get(key, 0) + n
        for kind in ("succeeded", "errored", "expired", "cancelled"):
            store.stats[f"lines_{kind}"] += res.counts[kind]
        store.bill(res.tin, res.tout, "batch")
        rec.counts, rec.fates, rec.keys = res.counts, {}, array("Q")
        if rec.provider == "anthropic":
            rec.results_path = store.folder / f"{rec.id}-output.jsonl"
            rec.status = "ended"
            rec.times["ended_at"] = now
            return
        if res.out_lines:
            rec.output_file_id = self.output_file(rec, "output", now)
        if res.err_lines:
            rec.error_file_id = self.output_file(rec, "errors", now)
        rec.status = ("cancelled" if ending == "cancelled" else
                      "expired" if res.counts["expired"] else "completed")
        rec.times[f"{rec.status}_at"] = now

    def output_file(self, rec: BatchRec, kind: str, now: float) -> str:
        path = self.store.folder / f"{rec.id}-{kind}.jsonl"
        fid = self.store.new_id("file-")
        self.store.files[fid] = FileRec(fid, path, path.name, "batch_output",
                                        path.stat().st_size, int(now))
        return fid

    def cancelled_unrun(self, rec: BatchRec) -> None:
        rec.status = "cancelled"
        rec.times["cancelled_at"] = time.time()

    def cancel(self, rec: BatchRec) -> bool:
        """Start cancelling a running batch (False: it is not running)."""
        if rec.status == "validating":  # OpenAI: cancelling, then cancelled, no line ran
            rec.status = "cancelling"
            rec.times["cancelling_at"] = time.time()
            asyncio.get_running_loop().call_soon(self.cancelled_unrun, rec)
            return True
        if rec.status != "in_progress":
            return rec.status in ("cancelling", "canceling")
        rec.status = "cancelling" if rec.provider == "openai" else "canceling"
        rec.times["cancelling_at"] = time.time()
        self.end(rec, "cancelled")
        return True


def openai_view(rec: BatchRec) -> dict[str, Any]:
    """The OpenAI ``Batch`` object of a batch."""
    t = {k: int(v) for k, v in rec.times.items()}
    succeeded = rec.counts.get("succeeded", 0)
    failed = rec.total - succeeded if rec.counts else 0
    return {
        "id": rec.id, "object": "batch", "endpoint": rec.endpoint, "model": rec.model,
        "errors": {"object": "list", "data": rec.errors} if rec.errors else None,
        "input_file_id": rec.input_file_id, "completion_window": "24h", "status": rec.status,
        "output_file_id": rec.output_file_id, "error_file_id": rec.error_file_id,
        "created_at": int(rec.created_at), "expires_at": int(rec.created_at) + 86_400,
        "in_progress_at": t.get("in_progress_at"), "finalizing_at": t.get("finalizing_at"),
        "completed_at": t.get("completed_at"), "failed_at": t.get("failed_at"),
        "expired_at": t.get("expired_at"), "cancelling_at": t.get("cancelling_at"),
        "cancelled_at": t.get("cancelled_at"),
        "request_counts": {"total": rec.total, "completed": succeeded, "failed": failed},
        "metadata": rec.metadata,
    }


def anthropic_view(rec: BatchRec, base: str) -> dict[str, Any]:
    """The Anthropic ``MessageBatch`` object of a batch."""
    ended = rec.status == "ended"
    c = rec.counts
    counts = {"processing": 0 if ended else rec.total, "succeeded": c.get("succeeded", 0),
              "errored": c.get("errored", 0), "canceled": c.get("cancelled", 0),
              "expired": c.get("expired", 0)}
    return {
        "id": rec.id, "type": "message_batch", "processing_status": rec.status,
        "request_counts": counts, "created_at": _now_iso(rec.created_at),
        "expires_at": _now_iso(rec.created_at + 86_400),
        "ended_at": _now_iso(rec.times.get("ended_at")), "archived_at": None,
        "cancel_initiated_at": _now_iso(rec.times.get("cancelling_at")),
        "results_url": f"{base}/v1/messages/batches/{rec.id}/results" if ended else None,
    }


def _page(ids: list[str], after: str | None, before: str | None, limit: int) -> list[str]:
    """A page of ``ids`` (oldest first) listed newest first, after/before a cursor."""
    newest = ids[::-1]
    if after and after in newest:
        return newest[newest.index(after) + 1:][:limit]
    if before and before in newest:
        return newest[:newest.index(before)][-limit:]
    return newest[:limit]


def _oa_error(status: int, message: str, code: str | None = None) -> web.Response:
    return web.json_response(openai_error(status, message, code), status=status)


def _an_error(status: int, message: str) -> web.Response:
    return web.json_response(anthropic_error(status, message), status=status)


class OpenAIRoutes:
    """OpenAI's Files and Batches endpoints."""

    def __init__(self, store: Store, batches: Batches) -> None:
        self.store, self.batches = store, batches

    def add(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/files", self.upload)
        r.add_get("/v1/files/{id}", self.file)
        r.add_delete("/v1/files/{id}", self.delete_file)
        r.add_get("/v1/files/{id}/content", self.content)
        r.add_post("/v1/batches", self.create)
        r.add_get("/v1/batches", self.list)
        r.add_get("/v1/batches/{id}", self.retrieve)
        r.add_post("/v1/batches/{id}/cancel", self.cancel)

    async def upload(self, request: web.Request) -> web.Response:
        """Multipart ``file`` + ``purpose``, the file streamed to disk."""
        fid = self.store.new_id("file-")
        path, name, purpose, size = self.store.folder / f"{fid}.jsonl", "upload.jsonl", "", 0
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if getattr(part, "name", None) == "purpose":
                purpose = (await part.text()).strip()  # type: ignore[union-attr]
            elif getattr(part, "name", None) == "file":
                name = part.filename or name  # type: ignore[union-attr]
                with path.open("wb") as f:
                    while chunk := await part.read_chunk(1 << 20):  # type: ignore[union-attr]
                        f.write(chunk)
                        size += len(chunk)
        if not path.exists():
            return _oa_error(400, "The request has no 'file' part.")
        rec = FileRec(fid, path, name, purpose or "batch", size, int(time.time()))
        self.store.files[fid] = rec
        self.store.stats["files"] += 1
        self.store.stats["file_bytes"] += size
        return web.json_response(_file_view(rec))

    def _file(self, request: web.Request) -> FileRec | None:
        return self.store.files.get(request.match_info["id"])

    async def file(self, request: web.Request) -> web.Response:
        rec = self._file(request)
        if rec is None:
            return _oa_error(404, f"No such File object: {request.match_info['id']}")
        return web.json_response(_file_view(rec))

    async def content(self, request: web.Request) -> web.StreamResponse:
        rec = self._file(request)
        if rec is None:
            return _oa_error(404, f"No such File object: {request.match_info['id']}")
        return web.FileResponse(rec.path, headers={"Content-Type": "application/octet-stream"})

    async def delete_file(self, request: web.Request) -> web.Response:
        rec = self.store.files.pop(request.match_info["id"], None)
        if rec is None:
            return _oa_error(404, f"No such File object: {request.match_info['id']}")
        in_use = any(b.input_path == rec.path and b.status in RUNNING
                     for b in self.store.batches.values())
        if not in_use:
            rec.path.unlink(missing_ok=True)
        self.store.stats["files_deleted"] += 1
        return web.json_response({"id": rec.id, "object": "file", "deleted": True})

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        problem = self._create_problem(body)
        if problem:
            return _oa_error(400, problem)
        file = self.store.files[body["input_file_id"]]
        rec = BatchRec(self.store.new_id("batch_"), "openai", body["endpoint"], file.path,
                       time.time(), input_file_id=file.id, metadata=body.get("metadata") or {})
        scanned = None
        if self.store.config["queue_refuse"]:
            scanned = await self.batches.scan(rec)
            rec.model, rec.tokens = scanned.model, scanned.tokens
            if not scanned.errors and self.batches.over_queue(rec):
                self.store.stats["queue_refused"] += 1
                return _oa_error(429, self.batches.queue_message(rec), "token_limit_exceeded")
        self.batches.add(rec)
        self.batches.spawn(self.batches.validate(rec, scanned))
        return web.json_response(openai_view(rec))

    def _create_problem(self, body: Any) -> str | None:
        if not isinstance(body, dict):
            return "The body must be a JSON object."
        if body.get("input_file_id") not in self.store.files:
            return f"No such File object: {body.get('input_file_id')}"
        if body.get("endpoint") not in OPENAI_ENDPOINTS:
            return (f"Invalid endpoint {body.get('endpoint')!r}: one of "
                    f"{', '.join(OPENAI_ENDPOINTS)}.")
        if body.get("completion_window") != "24h":
            return "completion_window must be '24h'."
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict) or len(meta) > 16 or any(
                len(str(k)) > 64 or not isinstance(v, str) or len(v) > 512
                for k, v in meta.items()):
            return ("metadata: at most 16 pairs, keys of at most 64 characters, string values "
                    "of at most 512.")
        return None

    def _batch(self, request: web.Request) -> BatchRec | None:
        rec = self.store.batches.get(request.match_info["id"])
        return rec if rec is not None and rec.provider == "openai" else None

    async def retrieve(self, request: web.Request) -> web.Response:
        rec = self._batch(request)
        if rec is None:
            return _oa_error(404, f"No batch found with id '{request.match_info['id']}'.")
        return web.json_response(openai_view(rec))

    async def cancel(self, request: web.Request) -> web.Response:
        rec = self._batch(request)
        if rec is None:
            return _oa_error(404, f"No batch found with id '{request.match_info['id']}'.")
        if not self.batches.cancel(rec):
            return _oa_error(409, f"Cannot cancel a batch with status {rec.status!r}.")
        return web.json_response(openai_view(rec))

    async def list(self, request: web.Request) -> web.Response:
        q = request.query
        limit = max(1, min(100, int(q.get("limit", 20))))
        ids = _page(self.store.order["openai"], q.get("after"), None, limit + 1)
        data = [openai_view(self.store.batches[i]) for i in ids[:limit]]
        return web.json_response({"object": "list", "data": data,
                                  "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None,
                                  "has_more": len(ids) > limit})


def _file_view(rec: FileRec) -> dict[str, Any]:
    return {"id": rec.id, "object": "file", "bytes": rec.bytes, "created_at": rec.created_at,
            "filename": rec.filename, "purpose": rec.purpose, "status": "processed",
            "expires_at": None, "status_details": None}


class AnthropicRoutes:
    """Anthropic's Message Batches endpoints."""

    def __init__(self, store: Store, batches: Batches) -> None:
        self.store, self.batches = store, batches

    def add(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/messages/batches", self.create)
        r.add_get("/v1/messages/batches", self.list)
        r.add_get("/v1/messages/batches/{id}", self.retrieve)
        r.add_delete("/v1/messages/batches/{id}", self.delete)
        r.add_post("/v1/messages/batches/{id}/cancel", self.cancel)
        r.add_get("/v1/messages/batches/{id}/results", self.results)

    def base(self) -> str:
        return f"http://127.0.0.1:{self.store.port}"

    async def create(self, request: web.Request) -> web.Response:
        """``{requests: [{custom_id, params}]}``, streamed to disk, then checked."""
        bid = self.store.new_id("msgbatch_")
        raw, path = self.store.folder / f"{bid}.json", self.store.folder / f"{bid}-input.jsonl"
        size, limit = 0, self.store.config["anthropic_max_bytes"]
        with raw.open("wb") as f:
            async for chunk in request.content.iter_chunked(1 << 20):
                size += len(chunk)
                if size <= limit:
                    f.write(chunk)
        if size > limit:
            raw.unlink()
            return _an_error(413, f"Request exceeds the maximum size of {limit} bytes.")
        problem = await asyncio.to_thread(
            _anthropic_input, raw, path, self.store.config["anthropic_max_requests"])
        raw.unlink()
        if problem:
            path.unlink(missing_ok=True)
            return _an_error(400, problem)
        rec = BatchRec(bid, "anthropic", "/v1/messages", path, time.time())
        sc = await self.batches.scan(rec)
        self.batches.add(rec)
        self.batches.run(rec, sc)
        return web.json_response(anthropic_view(rec, self.base()))

    def _batch(self, request: web.Request) -> BatchRec | None:
        rec = self.store.batches.get(request.match_info["id"])
        return rec if rec is not None and rec.provider == "anthropic" else None

    def _missing(self, request: web.Request) -> web.Response:
        return _an_error(404, f"No message batch with id {request.match_info['id']!r}.")

    async def retrieve(self, request: web.Request) -> web.Response:
        rec = self._batch(request)
        if rec is None:
            return self._missing(request)
        return web.json_response(anthropic_view(rec, self.base()))

    async def cancel(self, request: web.Request) -> web.Response:
        rec = self._batch(request)
        if rec is None:
            return self._missing(request)
        self.batches.cancel(rec)
        return web.json_response(anthropic_view(rec, self.base()))

    async def delete(self, request: web.Request) -> web.Response:
        rec = self._batch(request)
        if rec is None:
            return self._missing(request)
        if rec.status != "ended":
            return _an_error(400, "Message batches can only be deleted once they have "
                                  "finished processing; cancel it first.")
        del self.store.batches[rec.id]
        self.store.order["anthropic"].remove(rec.id)
        for path in (rec.input_path, rec.results_path):
            if path is not None:
                path.unlink(missing_ok=True)
        return web.json_response({"id": rec.id, "type": "message_batch_deleted"})

    async def results(self, request: web.Request) -> web.StreamResponse:
        rec = self._batch(request)
        if rec is None:
            return self._missing(request)
        if rec.status != "ended" or rec.results_path is None:
            return _an_error(400, f"Message batch {rec.id} has not finished processing.")
        if not rec.results_path.exists():
            return web.Response(body=b"", content_type="application/binary")
        return web.FileResponse(rec.results_path,
                                headers={"Content-Type": "application/binary"})

    async def list(self, request: web.Request) -> web.Response:
        q = request.query
        limit = max(1, min(1000, int(q.get("limit", 20))))
        order = self.store.order["anthropic"]
        ids = _page(order, q.get("after_id"), q.get("before_id"), limit + 1)
        more = len(ids) > limit
        ids = ids[-limit:] if q.get("before_id") else ids[:limit]
        data = [anthropic_view(self.store.batches[i], self.base()) for i in ids]
        return web.json_response({"data": data, "has_more": more,
                                  "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None})


def _anthropic_input(raw: Path, out: Path, max_requests: int) -> str | None:
    """Check a create body and write its requests as JSONL ``{custom_id, params}`` lines;
    the problem (Anthropic's 400 message) or None."""
    try:
        with raw.open("rb") as f:
            requests = json.load(f).get("requests")
    except (ValueError, AttributeError):
        return "The request body is not a JSON object."
    if not isinstance(requests, list) or not requests:
        return "requests: at least one request is required."
    if len(requests) > max_requests:
        return f"requests: at most {max_requests} requests a batch, got {len(requests)}."
    seen: set[str] = set()
    with out.open("wb") as f:
        for i, req in enumerate(requests):
            cid = req.get("custom_id") if isinstance(req, dict) else None
            if not isinstance(cid, str) or not _CUSTOM_ID.match(cid):
                return (f"requests.{i}.custom_id: {cid!r} must be 1-64 characters of "
                        "[a-zA-Z0-9_-].")
            if cid in seen:
                return f"requests.{i}.custom_id: {cid!r} is not unique in the batch."
            seen.add(cid)
            f.write(COMPACT.encode({"custom_id": cid, "params": req.get("params")}).encode()
                    + b"\n")
    return None


class OnlineRoutes:
    """The online endpoints: the same answer as a batch line, billed at the online price."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, app: web.Application) -> None:
        for endpoint in ("/v1/chat/completions", "/v1/embeddings", "/v1/responses",
                         "/v1/messages"):
            app.router.add_post(endpoint, self.handler(endpoint))

    def handler(self, endpoint: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            return await self.answer(endpoint, await request.read())
        return handle

    async def answer(self, endpoint: str, raw: bytes) -> web.Response:
        store, anthropic = self.store, endpoint == "/v1/messages"
        body = json.loads(raw)
        key = key_int(endpoint, body)
        seen = store.received.get(key, 0) + 1
        store.received[key] = seen
        store.stats["online_requests"] += 1
        billed = tokens(endpoint, body)
        wait = store.window.admit(sum(billed))
        headers = store.window.headers()
        if wait > 0:
            store.stats["online_rate_limited"] += 1
            headers["retry-after"] = f"{math.ceil(wait * 1000) / 1000:g}"
            return self.error(anthropic, 429, "Rate limit reached; retry later", headers)
        if store.config["latency"]:
            await asyncio.sleep(float(store.config["latency"]))
        fate = marker_fate(raw, seen, batch=False)
        if fate is not None:
            status = fate[1]
            if status < 500 and status != 429:
                store.answered[key] = store.answered.get(key, 0) + 1
            store.stats["online_errors"] += 1
            return self.error(anthropic, status, f"fake provider: status {status} for this "
                              "request", headers)
        store.answered[key] = store.answered.get(key, 0) + 1
        store.stats["online_ok"] += 1
        store.bill(*billed, "online")
        return web.json_response(answer(endpoint, body, f"{key:016x}", billed), headers=headers)

    @staticmethod
    def error(anthropic: bool, status: int, message: str,
              headers: dict[str, str]) -> web.Response:
        body = anthropic_error(status, message) if anthropic else openai_error(status, message)
        return web.json_response(body, status=status, headers=headers)


def _admin(app: web.Application, store: Store) -> None:
    async def stats(request: web.Request) -> web.Response:
        return web.json_response(store.summary())

    async def counts(request: web.Request) -> web.Response:
        keys = set(store.received) | set(store.answered)
        return web.json_response({f"{k:016x}": [store.received.get(k, 0),
                                                store.answered.get(k, 0)] for k in keys})

    async def reset(request: web.Request) -> web.Response:
        store.reset()
        return web.json_response({"ok": True})

    async def config(request: web.Request) -> web.Response:
        if request.method == "POST":
            changes = await request.json()
            unknown = set(changes) - set(DEFAULTS)
            if unknown:
                return web.json_response({"error": f"unknown knobs {sorted(unknown)}"},
                                         status=400)
            store.config.update(changes)
            if changes.keys() & {"rpm", "tpm", "window_seconds"}:
                store.window = store.new_window()
        return web.json_response(store.config)

    app.router.add_get("/stats", stats)
    app.router.add_get("/counts", counts)
    app.router.add_post("/reset", reset)
    app.router.add_get("/config", config)
    app.router.add_post("/config", config)


def _serve(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="hn-batch-server-"))
    store = Store(folder, json.loads(args.config))
    batches = Batches(store)
    app = web.Application(client_max_size=64 * 2**20)
    OpenAIRoutes(store, batches).add(app)
    AnthropicRoutes(store, batches).add(app)
    OnlineRoutes(store).add(app)
    _admin(app, store)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None, keepalive_timeout=3600)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", args.port))
        await web.SockSite(runner, sock, backlog=1024).start()
        store.port = sock.getsockname()[1]
        print(store.port, flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class BatchServer:
    """The fake provider as a subprocess on 127.0.0.1 (a context manager); ``config`` are
    the knobs of the module docstring."""

    def __init__(self, **config: Any) -> None:
        unknown = set(config) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"BatchServer: unknown knobs {sorted(unknown)}; "
                            f"known: {sorted(DEFAULTS)}")
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """What ``openai.OpenAI(base_url=...)`` takes."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """What ``anthropic.Anthropic(base_url=...)`` takes."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> BatchServer:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hypernodes_bench.batch_server", "--port", "0",
             "--config", json.dumps(self.config)], stdout=subprocess.PIPE)
        line = self.proc.stdout.readline() if self.proc.stdout else b""
        if not line.strip():
            self.stop()
            raise RuntimeError("the fake batch provider did not start")
        self.port = int(line)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT: the server removes its folder
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def _call(self, path: str, data: Any = None) -> Any:
        body = None if data is None else json.dumps(data).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=body,
                                     method="GET" if data is None else "POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def stats(self) -> dict[str, Any]:
        """Counters: files, batches, lines by outcome, online requests, tokens, cost,
        ``distinct`` requests, ``answered_max`` / ``answered_twice``..."""
        return self._call("/stats")

    def counts(self) -> dict[str, list[int]]:
        """Per ``request_key``: ``[received, answered]`` over the batch and online paths."""
        return self._call("/counts")

    def configure(self, **config: Any) -> dict[str, Any]:
        """Change knobs while running; returns the whole configuration."""
        return self._call("/config", config)

    def reset(self) -> None:
        """Zero the counters (files and batches stay)."""
        self._call("/reset", {})

    def __enter__(self) -> BatchServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--config", default="{}", help="the knobs, as a JSON object")
    return p.parse_args(argv)


if __name__ == "__main__":
    _serve(_parse())
