"""A map's batch folder (``into/_hn_batches/`` or in the cache dir): what the workers recorded,
what the driver did at the provider, and what the provider answered.

- ``RequestLog``: requests the workers recorded (``requests/<process>.jsonl``, appended by
  each process, read incrementally by the driver); identical requests are one.
- ``Ledger``: ``ledger.jsonl``, one fsync'd JSON event per line, written before and after
  every provider call (``file``, ``uploaded``, ``creating``, ``created``, ``online``,
  ``failed``, ``done``, ``lost``; each names its file by ``fid``), and by the user's
  commands (``cancel``: the user cancelled the file's batch; ``forget``: resubmit a lost
  batch's requests); ``Ledger.files()`` replays it into the state of each file. Each event
  is one ``write`` on an ``O_APPEND`` descriptor, so another process (``control.py``) may
  append while a driver runs.
- ``AnswerStore``: ``answers/<batch>.jsonl`` written whole (temp file + rename) once a batch
  is downloaded: ``{"d": digest, "s": status, "b": body}``; read by every process, new
  files picked up when the folder changes.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypernodes_dist.batchapi.identity import request_digest
from hypernodes_dist.batchapi.recording import REFUSED, Answer

__all__ = ["RequestLog", "Request", "Ledger", "FileState", "AnswerStore", "apply_event"]


@dataclass(frozen=True)
class Request:
    """One distinct request a worker recorded."""

    endpoint: str
    body: Mapping[str, Any]
    digest: str
    source: str = ""   # who recorded it (the resource), so the driver picks its transport


class RequestLog:
    """Requests recorded by the workers of a map (``folder/requests/``)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder) / "requests"
        self._lock = threading.Lock()
        self._path: Path | None = None
        self._offsets: dict[str, int] = {}
        self._seen: set[str] = set()

    def record(self, endpoint: str, body: Mapping[str, Any], source: str = "") -> None:
        """Append a request (a worker's side; safe from threads)."""
        data = json.dumps({"e": endpoint, "b": body, "s": source},
                          separators=(",", ":")) + "\n"
        with self._lock:
            if self._path is None:
                self.folder.mkdir(parents=True, exist_ok=True)
                self._path = self.folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
            with open(self._path, "a", encoding="utf-8") as f:
                f.write(data)

    def recorder(self, source: str) -> Callable[[str, Mapping[str, Any]], None]:
        """``record`` for one source (a resource's name)."""
        return functools.partial(_record_from, self, source)

    def new(self) -> list[Request]:
        """The distinct requests recorded since the last call (the driver's side)."""
        out: list[Request] = []
        if not self.folder.is_dir():
            return out
        for path in sorted(self.folder.glob("*.jsonl")):
            for raw in self._read_new(path):
                obj = json.loads(raw)
                digest = request_digest(obj["e"], obj["b"])
                if digest not in self._seen:
                    self._seen.add(digest)
                    out.append(Request(obj["e"], obj["b"], digest, obj.get("s", "")))
        return out

    def _read_new(self, path: Path) -> Iterator[bytes]:
        start = self._offsets.get(path.name, 0)
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        self._offsets[path.name] = start + end
        return iter(data[:end].splitlines())


def _record_from(log: RequestLog, source: str, endpoint: str, body: Mapping[str, Any]) -> None:
    log.record(endpoint, body, source)


@dataclass
class FileState:
    """One batch file as the ledger knows it."""

    fid: str          # unique per file the driver made (a tag repeats when lines go again)
    tag: str
    digests: list[str]
    file_id: str | None = None
    creating_at: float | None = None   # a create was sent (its answer may be lost)
    batch_id: str | None = None
    state: str = "new"                 # new | submitted | done | failed | lost
    counted: bool = True               # a failure counts against the lines' retries
    online: bool = False               # cancelled for online_after: unanswered lines go online
    provider: str = ""                 # the transport's provider ("openai", "anthropic")
    why: str = ""                      # the provider's message when the batch failed whole
    cancelled: bool = False            # the user cancelled it: unanswered lines not counted


class Ledger:
    """``folder/ledger.jsonl``: the driver's provider calls, before and after."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "ledger.jsonl"
        self.end = 0  # the byte after the last event read

    def write(self, event: str, **fields: Any) -> None:
        """Append one event, on disk before the call it announces is made (one ``write``
        on an ``O_APPEND`` descriptor: appends of other processes never interleave)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        data = (json.dumps({"ev": event, "t": time.time(), **fields},
                           separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def events(self, start: int = 0) -> Iterator[dict[str, Any]]:
        """The events from byte ``start`` on; ``self.end`` is where the last one ended."""
        self.end = start
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(start)
            for raw in f:
                if not raw.endswith(b"\n"):  # a torn last line: its call never ran
                    return
                self.end += len(raw)
                yield json.loads(raw)

    def commands(self) -> list[dict[str, Any]]:
        """The user's ``cancel`` and ``forget`` events appended since the last read (of
        ``files()`` or of this); the other events are skipped unparsed."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.end)
            data = f.read()
        data = data[:data.rfind(b"\n") + 1]
        self.end += len(data)
        return [json.loads(raw) for raw in data.splitlines()
                if raw.startswith((b'{"ev":"cancel"', b'{"ev":"forget"'))]

    def files(self) -> dict[str, FileState]:
        """Every file's state, replayed from the events (by file id)."""
        files: dict[str, FileState] = {}
        for ev in self.events():
            if ev["ev"] == "file":
                files[ev["fid"]] = FileState(ev["fid"], ev["tag"], list(ev["digests"]))
            elif ev.get("fid") in files:
                apply_event(files[ev["fid"]], ev)
        return files


def apply_event(state: FileState, ev: Mapping[str, Any]) -> None:
    """One ledger event (other than ``file``) applied to its file's state."""
    kind = ev["ev"]
    if kind == "uploaded":
        state.file_id = ev["file_id"]
    elif kind == "creating":
        state.creating_at = ev["t"]
    elif kind == "created":
        state.batch_id, state.state = ev["batch"], "submitted"
        state.provider = ev.get("provider", state.provider)
    elif kind == "online":
        state.online = True
    elif kind == "cancel":
        state.cancelled = True
    elif kind == "lost":
        state.state = "lost"
    elif kind == "forget" and state.state == "lost":
        state.state, state.counted = "failed", False
    elif kind in ("done", "failed"):
        state.state, state.counted = kind, bool(ev.get("counted", True))
        state.why = ev.get("why", "") or state.why


class AnswerStore:
    """The provider's answers by request digest (``folder/answers/``)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder) / "answers"
        self._answers: dict[str, Answer] = {}
        self._loaded: set[str] = set()
        self._mtime: int | None = None
        self._settled = False
        self._lock = threading.Lock()

    def put(self, name: str, answers: Iterable[tuple[str, Answer]]) -> int:
        """Write one batch's answers as ``name`` (whole, atomically); how many."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        n = 0
        with open(tmp, "w", encoding="utf-8") as f:
            for digest, answer in answers:
                f.write(json.dumps({"d": digest, "s": answer.status, "b": answer.body},
                                   separators=(",", ":")) + "\n")
                n += 1
        os.replace(tmp, self.folder / f"{name}.jsonl")
        return n

    def drop(self, prefix: str) -> None:
        """Remove the answer files named ``prefix...`` (before any worker reads them)."""
        for path in self.folder.glob(f"{prefix}*.jsonl"):
            path.unlink(missing_ok=True)

    def get(self, digest: str) -> Answer | None:
        """The answer to a request, or None (new answer files are read on a miss)."""
        got = self._answers.get(digest)
        # a miss, or a budget refusal (a rerun drops them), reads new answer files first
        if (got is None or got.status == REFUSED) and self._refresh():
            got = self._answers.get(digest)
        return got

    def __len__(self) -> int:
        self._refresh()
        return len(self._answers)

    def _refresh(self) -> bool:
        try:
            mtime = self.folder.stat().st_mtime_ns
        except FileNotFoundError:
            return False
        with self._lock:
            if mtime == self._mtime and self._settled:
                return False
            # a folder changed within the clock's grain may change again unseen: read it
            # again until its mtime is a second old
            self._mtime, self._settled = mtime, time.time_ns() - mtime > 1_000_000_000
            paths = sorted(self.folder.glob("*.jsonl"))
            if self._loaded - {p.name for p in paths}:  # files dropped (refusals): read anew
                self._answers, self._loaded = {}, set()
            for path in paths:
                if path.name not in self._loaded:
                    self._load(path)
            return True

    def _load(self, path: Path) -> None:
        with open(path, encoding="utf-8") as f:
            for raw in f:
                obj = json.loads(raw)
                self._answers[obj["d"]] = Answer(obj["s"], obj["b"])
        self._loaded.add(path.name)
