"""The time every planner and deadline reads, injected so that tests can set and move it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Now, timezone-aware in UTC."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def __repr__(self) -> str:
        return "SystemClock()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SystemClock)

    def __hash__(self) -> int:
        return hash(SystemClock)


@dataclass
class FixedClock:
    """A clock that stands still until told to move (tests)."""

    moment: datetime = field(default_factory=lambda: datetime(2026, 1, 1, tzinfo=UTC))

    def __post_init__(self) -> None:
        if self.moment.tzinfo is None:
            raise ValueError("FixedClock needs a timezone-aware datetime")
        self.moment = self.moment.astimezone(UTC)

    def now(self) -> datetime:
        return self.moment

    def advance(self, seconds: float) -> datetime:
        self.moment += timedelta(seconds=seconds)
        return self.moment


__all__ = ["Clock", "FixedClock", "SystemClock"]
