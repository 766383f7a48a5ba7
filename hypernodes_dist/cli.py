"""``hypernodes-dist`` command line: ``cache info PATH``, ``cache clear PATH [--scope S]
[--node NAME]``, ``cache prune PATH [--older-than 7d] [--max-size 10GB]`` (PATH: a DiskCache
directory or an ObjectStoreCache URL),
``batches status|cancel|resubmit-lost PATH`` (a map's provider batches; PATH: its ``into``
folder or its cache folder; see ``hypernodes_dist.run.batchcontrol``) and
``bench`` (workloads over engines and item counts; see ``hypernodes_dist.bench``).

Each top-level command is a subparser registered by a ``_add_<command>(subparsers)`` function
listed in ``_COMMANDS``; it sets ``func`` (``args -> exit code``) as its default. To add a
command (e.g. ``bench``), write ``_add_bench`` in its own module and append it to ``_COMMANDS``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hypernodes_dist.cache.base import SCOPES, Cache
from hypernodes_dist.cache.units import parse_age, parse_size
from hypernodes_dist.errors import CommandError
from hypernodes_dist.run.batchcontrol import (
    batch_status,
    cancel_batches,
    resubmit_lost_batches,
)

__all__ = ["build_parser", "main"]


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _open_cache(target: str) -> Cache | None:
    """The cache at ``target`` (a URL or a directory holding a cache); ``None`` if there is none.

    Never creates anything: an ``ObjectStoreCache`` for URLs and for directories laid out by
    one, a ``DiskCache`` for directories holding its database."""
    from hypernodes_dist.cache.disk import DB_NAME, DiskCache
    from hypernodes_dist.cache.objectstore import LAYOUT, ObjectStoreCache

    if "://" in target or os.path.isdir(os.path.join(target, LAYOUT)):
        return ObjectStoreCache(target)
    if os.path.isfile(os.path.join(target, DB_NAME)):
        return DiskCache(target)
    return None


def _with_cache(target: str, action: Callable[[Cache], Any]) -> Any:
    """``action(cache)`` on the cache at ``target`` (closed after); ``CommandError`` if there
    is none."""
    cache = _open_cache(target)
    if cache is None:
        raise CommandError(f"no cache at {target!r} (a DiskCache directory or an "
                           "ObjectStoreCache URL)")
    try:
        return action(cache)
    finally:
        cache.close()


def _cache_info(args: argparse.Namespace) -> int:
    stats = _with_cache(args.path, lambda cache: cache.stats())
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0
    if not stats.get("enabled"):
        print(f"error: cannot open the cache at {args.path!r}", file=sys.stderr)
        return 1
    print(f"cache:   {stats['path']}")
    print(f"entries: {stats['entries']}")
    print(f"size:    {_human(stats['size_bytes'])} ({stats['size_bytes']} bytes stored)")
    for label, table in (("scope", stats["by_scope"]), ("node", stats["by_node"])):
        for name, row in sorted(table.items()):
            print(f"{label} {name}: {row['entries']} entries, {_human(row['bytes'])}")
    return 0


def _cache_clear(args: argparse.Namespace) -> int:
    removed = _with_cache(args.path, lambda cache: cache.clear(args.scope, args.node))
    what = [f"scope {args.scope!r}" if args.scope else "all scopes"]
    if args.node:
        what.append(f"node {args.node!r}")
    print(f"removed {removed} entries ({', '.join(what)}) from {args.path}")
    return 0


def _cache_prune(args: argparse.Namespace) -> int:
    if args.older_than is None and args.max_size is None:
        raise CommandError("give --older-than AGE and/or --max-size SIZE")
    try:
        age = None if args.older_than is None else parse_age(args.older_than)
        size = parse_size(args.max_size, "--max-size")
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    removed, stats = _with_cache(args.path,
                                 lambda cache: (cache.prune(age, size), cache.stats()))
    why = []
    if args.older_than is not None:
        why.append(f"not used for {args.older_than}")
    if args.max_size is not None:
        why.append(f"least recently used beyond {args.max_size}")
    print(f"removed {removed.segments} segments ({removed.entries} entries, "
          f"{_human(removed.nbytes)}; {' or '.join(why)}) from {args.path.split('?', 1)[0]}")
    if stats.get("enabled"):
        kept = sum(row["bytes"] for row in stats["by_node"].values())
        print(f"kept {stats['entries']} entries, {_human(kept)} in segments "
              f"({_human(stats['size_bytes'])} on disk)")
    return 0


def _add_cache(subparsers: argparse._SubParsersAction) -> None:
    cache = subparsers.add_parser(
        "cache", help="inspect or clear a cache (DiskCache directory or ObjectStoreCache URL)")
    sub = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    info = sub.add_parser("info", help="entries and bytes, per scope and per node")
    info.add_argument("path", metavar="PATH", help="cache directory or URL (s3://..., gs://...)")
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    info.set_defaults(func=_cache_info)
    clear = sub.add_parser("clear", help="delete entries (all, one scope, one node)")
    clear.add_argument("path", metavar="PATH", help="cache directory or URL")
    clear.add_argument("--scope", choices=SCOPES, default=None, help="only this scope")
    clear.add_argument("--node", default=None, metavar="NAME", help="only this node's entries")
    clear.set_defaults(func=_cache_clear)
    prune = sub.add_parser("prune", help="delete entries not used lately, or beyond a size")
    prune.add_argument("path", metavar="PATH", help="cache directory or URL")
    prune.add_argument("--older-than", default=None, metavar="AGE",
                       help="delete entries not read or written for AGE (30m, 12h, 7d, 2w)")
    prune.add_argument("--max-size", default=None, metavar="SIZE",
                       help="then delete the least recently used until SIZE remain (500MB, 10GB)")
    prune.set_defaults(func=_cache_prune)


def _batches_status(args: argparse.Namespace) -> int:
    found = _batch_command(batch_status, args.path)
    if args.json:
        print(json.dumps([vars(s) for s in found], indent=2, sort_keys=True))
        return 0
    for s in found:
        states = ", ".join(f"{n} {state}" for state, n in sorted(s.files.items()))
        print(f"{s.ledger}: resource {s.resource!r} ({s.provider or 'no batch yet'}): "
              f"{states or 'no files'}")
        for what, ids in (("at the provider", s.running), ("lost (404)", s.lost)):
            if ids:
                print(f"  {what}: {' '.join(ids)}")
    if not found:
        print(f"no batch ledger under {args.path}")
    return 0


def _batches_cancel(args: argparse.Namespace) -> int:
    ids = _batch_command(cancel_batches, args.path)
    print(f"cancelled {len(ids)} batches{': ' + ' '.join(ids) if ids else ''}; a rerun of "
          "the map submits their unanswered requests again")
    return 0


def _batches_resubmit_lost(args: argparse.Namespace) -> int:
    ids = _batch_command(resubmit_lost_batches, args.path)
    print(f"{len(ids)} lost batches{': ' + ' '.join(ids) if ids else ''}; the next run of "
          "the map submits their requests again")
    return 0


def _batch_command(fn: Callable[[str], Any], path: str) -> Any:
    try:
        return fn(path)
    except (FileNotFoundError, ValueError) as exc:
        raise CommandError(str(exc)) from None


def _add_batches(subparsers: argparse._SubParsersAction) -> None:
    batches = subparsers.add_parser(
        "batches", help="a map's provider Batch API batches (its into= or cache folder)")
    sub = batches.add_subparsers(dest="batches_command", required=True, metavar="ACTION")
    status = sub.add_parser("status", help="the map's batch files by state (no provider call)")
    status.add_argument("--json", action="store_true", help="print machine-readable JSON")
    cancel = sub.add_parser(
        "cancel", help="cancel the map's batches at the provider (clients from the "
        "environment: OPENAI_API_KEY/OPENAI_BASE_URL, ANTHROPIC_API_KEY/ANTHROPIC_BASE_URL)")
    lost = sub.add_parser("resubmit-lost", help="let the next run submit again the requests "
                          "of batches the provider no longer knows (404)")
    for parser, func in ((status, _batches_status), (cancel, _batches_cancel),
                         (lost, _batches_resubmit_lost)):
        parser.add_argument("path", metavar="PATH", help="the map's into= folder, its "
                            "_hn_batches folder, or a cache folder (every map in it)")
        parser.set_defaults(func=func)


def _add_bench(subparsers: argparse._SubParsersAction) -> None:
    from hypernodes_bench.runner import add_bench_command

    add_bench_command(subparsers)


# Registered top-level commands.
_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_cache, _add_batches,
                                                                  _add_bench]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (one subparser per entry of ``_COMMANDS``)."""
    parser = argparse.ArgumentParser(
        prog="hypernodes-dist", description="hypernodes-dist command line tools."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hypernodes-dist`` console script; returns the exit code.

    A mistake in the command line (``CommandError``, or argparse's own) is one line on
    stderr and exit code 2; Ctrl-C is one line and 130; never a traceback for either."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CommandError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
