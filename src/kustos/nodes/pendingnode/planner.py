"""The PendingNode planner. Pure: what to do with one joining or leaving instance, at ``now``.

- Join, node Ready: Joined (the NodeImage controller pairs it and deletes this object).
- Join past its deadline: delete the instance (and its Node) at the provider, then this
  object: the slot is free and the NodeImage controller asks for a new node.
- Join without an instance yet past its deadline: take the creation back at the provider
  (a group size raised for it is lowered) and forget it.
- Leave, instance gone: done, delete this object.
- Leave past its deadline: ask the provider again, count the attempt, report it (Degraded).

``status`` is pure too: the status after a step, or after the provider refused it (the
refusal is recorded, Degraded with the provider's reason, before the error is retried).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kustos.runtime.cloud import InstanceState
from kustos.runtime.conditions import set_condition
from kustos.runtime.errors import ReconcileError
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
    node: str | None = None
    """The Node's name, when one shows the instance."""
    group_id: str = ""
    previous: Mapping[str, Any] = field(default_factory=dict)
    generation: int | None = None


@dataclass(frozen=True)
class DeleteInstance:
    reason: str


@dataclass(frozen=True)
class Forget:
    reason: str


@dataclass(frozen=True)
class CancelCreate(Forget):
    """Forget a Join whose instance never showed up, after taking its creation back."""


@dataclass(frozen=True)
class MarkJoined:
    pass


Step = DeleteInstance | CancelCreate | Forget | MarkJoined | Wait | Done


def plan(o: Observed) -> Step:
    late = o.deadline is not None and o.now >= o.deadline
    if o.goal == "Join":
        if o.node_ready:
            return MarkJoined()
        if not o.provider_id:
            return (
                CancelCreate("no instance showed up before the deadline")
                if late
                else Wait("instance requested", 5)
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


def status(o: Observed, step: Step, now: datetime, failure: ReconcileError | None = None) -> dict[str, Any]:
    """The status after ``step`` (acted on unless ``failure`` says the provider refused it). A
    refused delete still counts as an attempt: the next pass past the deadline tries again."""
    return _status(o.previous, o, step, o.generation, now, failure)


def unobserved(
    previous: Mapping[str, Any], generation: int | None, now: datetime, failure: ReconcileError
) -> dict[str, Any]:
    """The status when the instance could not even be looked up: the rest kept, Degraded says why."""
    return _status(previous, None, None, generation, now, failure)


def _status(
    previous: Mapping[str, Any], o: Observed | None, step: Step | None, generation: int | None, now: datetime,
    failure: ReconcileError | None = None,
) -> dict[str, Any]:  # fmt: skip
    result = dict(previous)
    if o is not None:
        result["instanceState"] = str(o.instance) if o.instance else None
    conditions = result.get("conditions")
    match step:
        case MarkJoined():
            result["phase"] = "Joined"
        case DeleteInstance():
            result["phase"] = "DeadlineExceeded"
            result["attempts"] = int(result.get("attempts") or 0) + 1
            result["message"] = step.reason
            conditions = set_condition(
                conditions, "Degraded", True, "DeadlineExceeded", step.reason, generation, now
            )
        case Wait():
            result["phase"] = "Pending"
    # A provider failure that has passed (DeadlineExceeded stays: the deadline did pass).
    degraded = next((c for c in conditions or [] if c.get("type") == "Degraded"), None) or {}
    passed = degraded.get("status") == "True" and degraded.get("reason") != "DeadlineExceeded"
    if failure is None and passed and isinstance(step, Wait | MarkJoined):
        conditions = set_condition(conditions, "Degraded", False, "AsExpected", "", generation, now)
    if failure is not None:
        doing = "deleting the instance" if isinstance(step, DeleteInstance) else "looking up the instance"
        message = f"{doing} failed: {failure.message}"[:1000]
        result["message"] = message
        conditions = set_condition(conditions, "Degraded", True, failure.reason, message, generation, now)
    if conditions is not None:
        result["conditions"] = conditions
    return result


__all__ = ["DeleteInstance", "Forget", "MarkJoined", "Observed", "Step", "plan", "status", "unobserved"]
