"""What a family's ``register(manager, deps)`` receives besides the manager.

One ``Deps`` per operator process, built by ``kustos run`` (and by tests, with a
``FixedClock``): the clock every planner reads ``now`` from, and the cloud provider the
node families create, delete and fence instances through (None when kustos runs without
one: node rollouts then wait, and maintenance falls back to its fencing annotation or the toleration).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kustos.runtime.clock import Clock, SystemClock
from kustos.runtime.cloud import CloudProvider


@dataclass(frozen=True)
class Deps:
    clock: Clock = field(default_factory=SystemClock)
    cloud: CloudProvider | None = None


__all__ = ["Deps"]
