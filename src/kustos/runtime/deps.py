"""What a family's ``register(manager, deps)`` receives besides the manager.

One ``Deps`` per operator process, built by ``kustos run`` (and by tests, with a
``FixedClock``): the clock every planner reads ``now`` from and the operator's
settings. A cloud provider joins it when the node families need one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kustos.runtime.clock import Clock, SystemClock


@dataclass(frozen=True)
class Deps:
    clock: Clock = field(default_factory=SystemClock)
    settings: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


__all__ = ["Deps"]
