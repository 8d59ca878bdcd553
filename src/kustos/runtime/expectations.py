"""Objects a controller created that its informer has not delivered yet.

An informer sees a controller's own writes a moment later. A pass planned from a cache that
does not yet hold the pod the previous pass created would create another one (a second seed
of a rebuild, an extra member). client-go's ReplicaSet controller guards with
"expectations"; this is the same idea, by name: remember what was created, lower the
expectation when the informer delivers any event for it (a pod created and deleted at once
still counts as seen), and skip planning for that owner until then (or a deadline passes,
in case the event was lost with its watch).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from kustos.runtime.clock import Clock

DEFAULT_TTL = timedelta(minutes=5)  # client-go's ExpectationsTimeout


class Expectations:
    def __init__(self, clock: Clock, ttl: timedelta = DEFAULT_TTL) -> None:
        self._clock = clock
        self._ttl = ttl
        self._pending: dict[str, dict[str, datetime]] = {}

    def expect(self, owner: str, name: str) -> None:
        """``owner`` (a cache key) just created ``name``."""
        self._pending.setdefault(owner, {})[name] = self._clock.now() + self._ttl

    def seen(self, owner: str, name: str) -> None:
        """The informer delivered an event for ``name`` (call from its handler)."""
        pending = self._pending.get(owner)
        if pending is not None:
            pending.pop(name, None)
            if not pending:
                del self._pending[owner]

    def unseen(self, owner: str) -> list[str]:
        """What ``owner`` created that the informer has not delivered yet (expired ones forgotten)."""
        pending = self._pending.get(owner)
        if not pending:
            return []
        now = self._clock.now()
        for name in [n for n, deadline in pending.items() if deadline <= now]:
            del pending[name]
        if not pending:
            del self._pending[owner]
            return []
        return sorted(pending)

    def forget(self, owner: str) -> None:
        """The owner is gone: nothing more to wait for."""
        self._pending.pop(owner, None)


__all__ = ["DEFAULT_TTL", "Expectations"]
