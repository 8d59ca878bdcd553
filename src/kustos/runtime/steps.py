"""The two steps every planner shares: wait and look again, or nothing left to do.

Each family's planner puts these in its own ``Step`` union beside its own steps, so a
controller's ``match`` reads the same in every family.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Wait:
    """Something is in the way (``reason`` says what); look again in ``seconds``."""

    reason: str
    seconds: float = 2.0


@dataclass(frozen=True)
class Done:
    """Everything is as the spec asks: nothing to do until something changes."""


# An Event's type, here (pure) so that planners may say it; runtime.events uses the same.
NORMAL = "Normal"
WARNING = "Warning"


@dataclass(frozen=True)
class Note:
    """An Event a pass wants emitted once its status is written (e.g. "Upgraded"); pure, so that
    a planner may say which transitions deserve one."""

    reason: str
    message: str
    type: str = NORMAL  # or WARNING


__all__ = ["NORMAL", "WARNING", "Done", "Note", "Wait"]
