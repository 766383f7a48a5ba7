"""Progress on Daft's Ray runner: workers hand their finished row counts to a small Ray
actor of the map's own (fire and forget), which a driver thread empties every
``INTERVAL`` seconds (Ray's own channel: it reaches workers on any node)."""

from __future__ import annotations

import threading
from typing import Any

import ray

from hypernodes_dist.execution.progress import INTERVAL, ProgressChannel, Receive, Updates

__all__ = ["RayMailbox"]


class _Mailbox:
    """The actor: the latest update per batch since the driver last took them."""

    def __init__(self) -> None:
        self.updates: Updates = {}

    def put(self, updates: Updates) -> None:
        for offset, (done, metered) in updates.items():
            old_done, old_metered = self.updates.get(offset, (0, None))
            self.updates[offset] = (max(done, old_done),
                                    old_metered if metered is None else metered)

    def take(self) -> Updates:
        out, self.updates = self.updates, {}
        return out


class RayMailbox(ProgressChannel):
    """``send`` calls the actor's ``put`` without waiting; the driver polls ``take``."""

    def __init__(self, receive: Receive) -> None:
        super().__init__()
        # an actor handle: Ray's stubs do not type its methods' ``.remote``
        self._actor: Any = ray.remote(num_cpus=0)(_Mailbox).remote()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(receive,), daemon=True,
                                        name="hn-progress")
        self._thread.start()

    def send(self, updates: Updates) -> None:
        self._actor.put.remote(updates)

    def _poll(self, receive: Receive) -> None:
        while not self._stop.wait(INTERVAL):
            try:
                updates = ray.get(self._actor.take.remote(), timeout=10)
            except Exception:  # noqa: BLE001 -- Ray shutting down: no more progress
                return
            if updates:
                receive(updates)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=11)
        try:
            ray.kill(self._actor)
        except Exception:  # noqa: BLE001 -- already gone with Ray
            pass

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key, "_actor": self._actor}
