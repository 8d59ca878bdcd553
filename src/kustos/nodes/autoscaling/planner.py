"""The AutoscalingStrategy planner. Pure.

While any NodeImage is rolling out, the cluster-autoscaler's Deployment is held at 0
replicas; the replicas the user had are saved first (an annotation on the Deployment, so
a restarted operator restores them too) and restored afterwards, whatever they were,
including 0 (Constellation re-enabled an autoscaler the user had turned off).

"Rolling out" is narrow on purpose (``in_flight``): a NodeImage counts only while this
operator has a cloud provider and the NodeImage's status shows a replacement under way: an
instance asked for and not yet joined (``pending``), or a donor paired with its heir
(``donors``, ``heirs``, ``replacements``). Progressing alone is not enough: it is True for
any step short of Done, including "no cloud provider configured" and a rollout waiting
for capacity, and the autoscaler would be held at 0 for as long as those last.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kustos.runtime.conditions import note_failure, set_condition
from kustos.runtime.errors import ReconcileError
from kustos.runtime.steps import Done, Wait

# The NodeImage status fields (written by the NodeImage controller, api/nodeimage.py) that
# name a replacement under way.
IN_FLIGHT_FIELDS = ("pending", "heirs", "donors", "replacements")


def in_flight(images: Iterable[Mapping[str, Any]], provider: bool) -> list[str]:
    """The NodeImages (by name) with a heir, pair or join under way; none without a provider
    (no NodeImage can replace a node then) and none that is paused."""
    if not provider:
        return []
    names = []
    for image in images:
        if (image.get("spec") or {}).get("paused"):
            continue
        status = image.get("status") or {}
        if any(status.get(field) for field in IN_FLIGHT_FIELDS):
            names.append(str((image.get("metadata") or {}).get("name", "")))
    return sorted(names)


@dataclass(frozen=True)
class Observed:
    enabled: bool
    rolling_out: bool
    deployment_exists: bool
    replicas: int
    saved: int | None
    """The annotation kustos wrote when it paused the Deployment (None: not paused by kustos)."""
    deployment: str = "kube-system/cluster-autoscaler"
    previous: Mapping[str, Any] = field(default_factory=dict)
    generation: int | None = None


@dataclass(frozen=True)
class Pause:
    save: int


@dataclass(frozen=True)
class Restore:
    replicas: int


Step = Pause | Restore | Wait | Done


def plan(o: Observed) -> Step:
    if not o.deployment_exists:
        return Wait("the cluster-autoscaler Deployment does not exist", 60)
    hold = o.enabled and o.rolling_out
    if hold and o.saved is None:
        return Pause(o.replicas)
    if not hold and o.saved is not None:
        return Restore(o.saved)
    return Done()


def status(o: Observed, step: Step, now: datetime, failure: ReconcileError | None = None) -> dict[str, Any]:
    """The whole status after ``step`` (acted on unless ``failure`` says it failed)."""
    result: dict[str, Any] = dict(o.previous)
    match step:
        case Pause() if failure is None:
            result.update(paused=True, savedReplicas=step.save, replicas=0)
        case Restore() if failure is None:
            result.update(paused=False, savedReplicas=None, replicas=step.replicas)
        case _:
            result.update(paused=o.saved is not None, savedReplicas=o.saved, replicas=o.replicas)
    exists = o.deployment_exists
    reason = "AsExpected" if exists else "DeploymentMissing"
    message = "" if exists else f"Deployment {o.deployment} not found"
    conditions = set_condition(
        result.get("conditions"), "Degraded", not exists, reason, message, o.generation, now
    )
    result["conditions"] = note_failure(conditions, failure, now, o.generation, "Degraded")
    return result


__all__ = ["IN_FLIGHT_FIELDS", "Observed", "Pause", "Restore", "Step", "in_flight", "plan", "status"]
