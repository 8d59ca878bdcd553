"""The PendingNode planner. Pure: what to do with one joining or leaving instance, at ``now``.

- Join, node Ready: Joined (the NodeImage controller pairs it and deletes this object).
- Join past its deadline: delete the instance (and its Node) at the provider, then this
  object: the slot is free and the NodeImage controller asks for a new node.
- Join without an instance yet past its deadline: forget it.
- Leave, instance gone: done, delete this object.
- Leave past its deadline: ask the provider again, count the attempt, report it (Degraded).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kustos.runtime.cloud import InstanceState
from kustos.runtime.steps import Done, Wait


@dataclass(frozen=True)
class Observed:
    goal: str
    provider_id: str
    deadline: datetime | None
    now: datetime
    node_ready: bool
    node_exists: bool
    instance: InstanceState | None
    """None while the Join has no provider ID yet."""


@dataclass(frozen=True)
class DeleteInstance:
    reason: str


@dataclass(frozen=True)
class Forget:
    reason: str


@dataclass(frozen=True)
class MarkJoined:
    pass


Step = DeleteInstance | Forget | MarkJoined | Wait | Done


def plan(o: Observed) -> Step:
    late = o.deadline is not None and o.now >= o.deadline
    if o.goal == "Join":
        if o.node_ready:
            return MarkJoined()
        if not o.provider_id:
            return (
                Forget("no instance showed up before the deadline") if late else Wait("instance requested", 5)
            )
        if late:
            if o.instance == InstanceState.GONE and not o.node_exists:
                return Forget("the instance never became a Ready node and is gone")
            return DeleteInstance("not Ready by its deadline: deleting it so that a new node can be tried")
        left = (o.deadline - o.now).total_seconds() if o.deadline else 30
        return Wait("joining", max(1.0, min(left, 10.0)))
    if o.instance == InstanceState.GONE:
        return Forget("the instance is gone")
    if late:
        return DeleteInstance("still present past its deadline: deleting it again")
    return Wait("leaving", 5)


__all__ = ["DeleteInstance", "Forget", "MarkJoined", "Observed", "Step", "plan"]
