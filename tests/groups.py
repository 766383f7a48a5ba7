"""Session fixtures that live only as long as their ``xdist_group``.

Under ``--dist loadgroup`` one pytest-xdist worker runs all the tests of a group in a row
(``tests/conftest.py`` orders them), then other tests. A session fixture only that group
uses (a Dask cluster, an engine's process pool) would otherwise stay up for the rest of
the worker's session: its processes hold memory, and a cluster's heartbeats cost CPU while
the other tests run. ``finish_after_group`` tears it down after the group's last test; a
later test asking for it again (a rerun) gets a new one, as for any finished fixture.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest


def xdist_group(item: pytest.Item | None) -> str | None:
    mark = None if item is None else item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return mark.args[0] if mark.args else mark.kwargs.get("name")


_USED: dict[str, list] = {}  # group -> the session FixtureDefs its tests used here


def finish_after_group(item: pytest.Item, nextitem: pytest.Item | None,
                       names: Iterable[str]) -> None:
    """After ``item``: if it is the last test of its group here (``nextitem`` is in another
    group), finish the session fixtures among ``names`` the group's tests used (each with
    its dependents first, as pytest does). At the session's end (``nextitem`` None) pytest
    finishes them itself."""
    group = xdist_group(item)
    if group is None:
        return
    # pytest's record of the fixtures the test used, also those it asked for by name
    # (request.getfixturevalue); FixtureDef.finish is what pytest calls when a session
    # fixture's parameter changes
    defs = item._request._fixture_defs  # type: ignore[attr-defined]
    used = _USED.setdefault(group, [])
    used += [defs[name] for name in names if name in defs and defs[name].scope == "session"
             and defs[name] not in used]
    if nextitem is None or xdist_group(nextitem) == group:
        return
    for fixturedef in _USED.pop(group):
        if fixturedef.cached_result is not None:
            fixturedef.finish(item._request)  # type: ignore[attr-defined]
