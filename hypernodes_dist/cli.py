"""``hypernodes-dist`` command line: ``cache info PATH``, ``cache clear PATH [--scope S]`` and
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

from hypernodes_dist.cache.disk import SCOPES, DiskCache

__all__ = ["build_parser", "main"]


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _is_cache_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "cache.db"))


def _with_cache(path: str, action: Callable[[DiskCache], Any]) -> Any:
    """``action(cache)`` on the cache at ``path`` (closed after); ``None`` if there is none."""
    if not _is_cache_dir(path):
        print(f"error: no cache at {path!r}", file=sys.stderr)
        return None
    cache = DiskCache(path)
    try:
        return action(cache)
    finally:
        cache.close()


def _cache_info(args: argparse.Namespace) -> int:
    stats = _with_cache(args.path, DiskCache.stats)
    if stats is None:
        return 2
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0
    if not stats.get("enabled"):
        print(f"error: cannot open the cache at {args.path!r}", file=sys.stderr)
        return 1
    print(f"path:    {stats['path']}")
    print(f"entries: {stats['entries']}")
    print(f"size:    {_human(stats['size_bytes'])} ({stats['size_bytes']} bytes on disk)")
    by_scope = stats.get("by_scope")
    if by_scope is None:
        print("scopes:  unknown")
    else:
        for scope, row in sorted(by_scope.items()):
            print(f"scope {scope}: {row['entries']} entries, {_human(row['file_bytes'])} in files")
    return 0


def _cache_clear(args: argparse.Namespace) -> int:
    removed = _with_cache(args.path, lambda cache: cache.clear(args.scope))
    if removed is None:
        return 2
    what = f"scope {args.scope!r}" if args.scope else "all scopes"
    print(f"removed {removed} entries ({what}) from {args.path}")
    return 0


def _add_cache(subparsers: argparse._SubParsersAction) -> None:
    cache = subparsers.add_parser("cache", help="inspect or clear a DiskCache directory")
    sub = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    info = sub.add_parser("info", help="entries, size on disk and entries per scope")
    info.add_argument("path", metavar="PATH", help="cache directory")
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    info.set_defaults(func=_cache_info)
    clear = sub.add_parser("clear", help="delete entries (all, or one scope)")
    clear.add_argument("path", metavar="PATH", help="cache directory")
    clear.add_argument("--scope", choices=SCOPES, default=None, help="only this scope")
    clear.set_defaults(func=_cache_clear)


def _add_bench(subparsers: argparse._SubParsersAction) -> None:
    from hypernodes_bench.runner import add_bench_command

    add_bench_command(subparsers)


# Registered top-level commands.
_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_cache, _add_bench]


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
    """Entry point of the ``hypernodes-dist`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
