"""Walking a change of spec.version across several minors, one step at a time (pure).

``versions.version_path`` says which versions the members run in turn (3.5.35 -> 3.7.3 is
3.6.16, then 3.7.3). Each step is an ordinary one-minor upgrade or rollback that the
planner rolls member by member, gated by health. Between two steps, one more gate: etcd's
own cluster version (``/version``'s ``etcdcluster``, which etcd's leader raises once every
member runs the newer minor, and lowers once a downgrade finishes) must have reached the
step's minor, and no downgrade may still be enabled; a member of the next minor is refused
by a cluster that has not.

The step under way is recorded in status.versionPath, never held in memory: a restarted
operator carries on with the step it finds there, and moves on only on what etcd reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kustos.api.etcd import EtcdCluster, VersionPathStatus
from kustos.etcd.versions import recorded_step, rollback_target, version_path
from kustos.runtime.times import rfc3339


@dataclass(frozen=True)
class Progress:
    """What this pass rolls to, and what status.versionPath records."""

    version: str  # Observed.version: the version members roll to now
    rollback: str | None  # Observed.rollback: the minor etcd's downgrade takes this step to
    hold: str | None = None  # why the next step waits for etcd, if it does
    path: VersionPathStatus | None = None  # None: no path across minors under way


def minor_of(version: str) -> str:
    """``major.minor`` ("3.6.0" -> "3.6"); "" when unknown."""
    parts = version.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else ""


def under_way(cluster: EtcdCluster) -> bool:
    """Whether a path across minors is (or is about to be) walked: then etcd's cluster version
    is asked each pass."""
    current = cluster.status.current_version if cluster.status else None
    if not current or current == cluster.spec.version:
        return False
    if recorded_step(cluster) is not None:  # the last step may be one minor from what runs
        return True
    path = version_path(current, cluster.spec.version)
    return not isinstance(path, str) and len(path) > 1


def progress(cluster: EtcdCluster, cluster_version: str, downgrade_enabled: bool, now: datetime) -> Progress:
    """The step members roll to this pass: the recorded one, or the next once every member runs
    it and etcd's cluster version (``cluster_version``, "" when unknown) has reached its minor."""
    status = cluster.status
    current = status.current_version if status else None
    wanted = cluster.spec.version
    if not current:
        return Progress(wanted, None)
    fresh = version_path(current, wanted)
    if isinstance(fresh, str):  # refused: VersionAccepted says why; the members stay
        return Progress(current, None)
    recorded = status.version_path if status and recorded_step(cluster) else None
    if recorded is None:
        if len(fresh) <= 1:  # one step (or none): the ordinary upgrade or rollback
            return Progress(wanted, rollback_target(current, wanted))
        recorded = VersionPathStatus(
            source=current, target=wanted, steps=list(fresh), step=fresh[0], started_at=rfc3339(now)
        )
    steps, step = recorded.steps, recorded.step
    at = steps.index(step)
    if current == step:
        if at == len(steps) - 1:  # every member runs the target: done
            return Progress(wanted, None)
        if minor_of(cluster_version) != minor_of(step) or downgrade_enabled:
            said = f"cluster version {cluster_version}" if cluster_version else "no cluster version"
            if downgrade_enabled:
                said += ", its downgrade still enabled"
            hold = (
                f"every member runs etcd {step}; etcd reports {said}: etcd {steps[at + 1]} "
                f"(step {at + 2} of {len(steps)} to {wanted}) starts once it reports {minor_of(step)}"
            )
            return Progress(step, None, hold, recorded)
        step = steps[at + 1]
        recorded = recorded.model_copy(update={"step": step})
    return Progress(step, rollback_target(current, step), None, recorded)


def describe_step(path: VersionPathStatus) -> str:
    """``step 1 of 2 (etcd 3.6.16) of 3.5.35 -> 3.7.3``, for messages."""
    at = path.steps.index(path.step) if path.step in path.steps else 0
    return f"step {at + 1} of {len(path.steps)} (etcd {path.step}) of {path.source} -> {path.target}"


def halted(path: VersionPathStatus, message: str) -> str:
    """The UpgradeHalted message of a step of a path: which step failed, and how to go on."""
    at = path.steps.index(path.step) if path.step in path.steps else 0
    before = path.steps[at - 1] if at > 0 else path.source
    return (
        f"{describe_step(path)} failed: {message}; the members that finished earlier steps run "
        f"etcd {before}: spec.version {before} keeps the cluster there"
    )


__all__ = ["Progress", "describe_step", "halted", "minor_of", "progress", "under_way"]
