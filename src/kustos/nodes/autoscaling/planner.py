"""The AutoscalingStrategy planner. Pure.

While any NodeImage is rolling out, the cluster-autoscaler's Deployment is held at 0
replicas; the replicas the user had are saved first (an annotation on the Deployment, so
a restarted operator restores them too) and restored afterwards, whatever they were,
including 0 (Constellation re-enabled an autoscaler the user had turned off).
"""

from __future__ import annotations

from dataclasses import dataclass

from kustos.runtime.steps import Done, Wait


@dataclass(frozen=True)
class Observed:
    enabled: bool
    rolling_out: bool
    deployment_exists: bool
    replicas: int
    saved: int | None
    """The annotation kustos wrote when it paused the Deployment (None: not paused by kustos)."""


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


__all__ = ["Observed", "Pause", "Restore", "Step", "plan"]
