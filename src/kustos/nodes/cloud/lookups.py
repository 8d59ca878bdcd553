"""The short-lived cache every cloud provider keeps of its read answers.

Cloud read APIs are rate-limited per account, and a rollout asks the same questions (a
group, an instance) on every pass of several controllers: answers are kept for
``seconds`` (0: not at all) and the whole cache is dropped after any change the provider
makes, so a pass never plans on an answer older than its own write.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class LookupCache:
    def __init__(self, seconds: float, monotonic: Callable[[], float]) -> None:
        self.seconds = seconds
        self._monotonic = monotonic
        self._entries: dict[Hashable, tuple[float, Any]] = {}

    def get(self, key: Hashable) -> Any:
        """The answer kept for ``key``, or None when there is none or it expired."""
        hit = self._entries.get(key)
        if hit is None or self._monotonic() >= hit[0]:
            return None
        return hit[1]

    def put(self, key: Hashable, value: T) -> T:
        """Keep ``value`` for ``key`` (unless caching is off) and return it."""
        if self.seconds > 0:
            self._entries[key] = (self._monotonic() + self.seconds, value)
        return value

    def clear(self) -> None:
        self._entries.clear()
