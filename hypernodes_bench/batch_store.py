"""The fake batch provider's state and the batches' life (``batch_server`` serves it).

``Store`` holds files, batches, knobs and counters; ``Batches`` moves a batch through
validating -> in_progress -> (finalizing) -> completed / expired / cancelled / failed
(Anthropic: in_progress -> canceling -> ended). Reading a batch's input (``scan``) and
writing its results (``finish``) run in a worker thread, streaming the files on disk, and
hand back what the event loop applies (counters, fates), so memory per line stays small.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from array import array
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

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

__all__ = ["DEFAULTS", "HANG_POINTS", "Store", "Batches", "BatchRec", "FileRec", "openai_view",
           "anthropic_view", "page", "RUNNING", "OPENAI_ENDPOINTS"]

DEFAULTS: dict[str, Any] = {
    "delay": 0.0, "validate_delay": 0.0, "expire_after": None, "queue_tokens": None,
    "queue_refuse": False, "fail_batches": 0, "max_lines": 50_000, "max_bytes": 200 * 2**20,
    "max_embedding_inputs": 50_000, "anthropic_max_requests": 100_000,
    "anthropic_max_bytes": 256 * 2**20, "price_online": 1e-6, "price_batch": 5e-7,
    "rpm": None, "tpm": None, "window_seconds": 60.0, "latency": 0.0, "headers": True,
    "hang": None, "hang_after": 0,
}
HANG_POINTS = ("upload", "create", "status", "results")
OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses")
RUNNING = ("validating", "in_progress", "finalizing", "cancelling")
_STAT_NAMES = ("files", "file_bytes", "files_deleted", "batches", "batches_failed",
               "queue_failed", "queue_refused", "batch_lines", "lines_succeeded",
               "lines_errored", "lines_expired", "lines_cancelled", "online_requests",
               "online_ok", "online_errors", "online_rate_limited", "tokens_online",
               "tokens_batch", "hung")

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
        self.path, self.file, self.lines = path, path.open("wb"), 0
        self.block: list[bytes] = []

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
        self.released = asyncio.Event()
        self.reset()

    def new_window(self) -> Window:
        """The online endpoints' rate limits (``llm_server``'s sliding window)."""
        cfg = self.config
        return Window(cfg["rpm"], cfg["tpm"], float(cfg["window_seconds"]))

    async def hang(self, where: str) -> None:
        """The ``hang`` knob: a request at ``where`` (one of ``HANG_POINTS``) has done its
        work and its answer never comes — until the knob changes — once ``hang_after``
        such requests have been let through; ``stats()["hung"]`` counts them (a kill test
        kills its client then)."""
        cfg = self.config
        if cfg["hang"] != where:
            return
        if cfg["hang_after"] > 0:
            cfg["hang_after"] -= 1
            return
        self.stats["hung"] += 1
        await self.released.wait()

    def release(self) -> None:
        """Let the hung requests answer (the knob changed)."""
        self.released.set()
        self.released = asyncio.Event()

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
    out, inputs = Scan(), 0
    ids: set[str] = set()
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
    if isinstance(cid, str):
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
        self.writing: set[asyncio.Task[Any]] = set()  # results being written

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def settle(self) -> None:
        """Wait for the results being written (batches ending now, as of the next turn of
        the loop: a batch of no delay ends there)."""
        await asyncio.sleep(0)
        await asyncio.gather(*self.writing, return_exceptions=True)

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
        task = self.spawn(self.write(rec, done, ending))
        self.writing.add(task)
        task.add_done_callback(self.writing.discard)

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


def page(ids: list[str], after: str | None, before: str | None, limit: int) -> list[str]:
    """A page of ``ids`` (oldest first) listed newest first, after/before a cursor."""
    newest = ids[::-1]
    if after and after in newest:
        return newest[newest.index(after) + 1:][:limit]
    if before and before in newest:
        return newest[:newest.index(before)][-limit:]
    return newest[:limit]
