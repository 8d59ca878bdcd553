"""The EtcdCluster's step around the membership planner: how a cluster begins from a backup
(spec.restore), from a cluster kustos did not create (spec.adopt), or again after losing
quorum (a rebuild). Pure: the controller observes (caches, etcd's answers) and acts.

``planner.plan`` decides the membership; where it would bootstrap a seed or can only report
a lost quorum, ``plan`` here decides instead whether to restore, adopt or rebuild, and with
what. A rebuild under way is ``recovery.plan_recovery``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from kustos.api.etcd import EtcdCluster, EtcdClusterStatus
from kustos.etcd import planner, recovery
from kustos.etcd.recovery import BackupCandidate, Source, Survivor
from kustos.etcd.versions import rollback_target, upgrade_refusal, version_path
from kustos.runtime.times import parse_duration, parse_rfc3339

# ---- the steps beyond the membership planner's -----------------------------------------------


@dataclass(frozen=True)
class Blocked:
    """spec.restore or spec.adopt cannot start yet: ``reason`` is RestoreWaiting or AdoptionWaiting."""

    reason: str
    message: str  # for the Degraded condition
    event: str  # for the Event


@dataclass(frozen=True)
class StartRebuild:
    """Record a rebuild (quorum lost, asked for, or spec.restore) as the new epoch's intent."""

    source: Source
    reason: str
    epoch: int


@dataclass(frozen=True)
class ExternalMember:
    """A member of a cluster to adopt, as its member list names it."""

    id: int
    name: str
    client_urls: tuple[str, ...]


@dataclass(frozen=True)
class StartAdoption:
    """Record an existing cluster's members as the original ones the planner replaces."""

    cluster_id: int
    members: tuple[ExternalMember, ...]
    version: str


# ---- what the decisions read ---------------------------------------------------------------


@dataclass(frozen=True)
class EndpointAnswer:
    """What one of spec.adopt's endpoints said of itself (etcd's status)."""

    url: str
    cluster_id: int
    version: str
    has_leader: bool
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class AdoptionSeen:
    """The cluster behind spec.adopt's endpoints: every endpoint's answer and the member list,
    or the first that did not answer."""

    answers: tuple[EndpointAnswer, ...] = ()
    members: tuple[ExternalMember, ...] = ()
    cluster_id: int = 0
    unreachable: str | None = None  # "<url> does not answer: <why>"


@dataclass(frozen=True)
class ClusterObserved:
    """The input of ``plan``: the membership planner's and what a restore, an adoption or a
    rebuild would read."""

    cluster: EtcdCluster
    membership: planner.Observed
    now: datetime
    request: str | None = None  # ``kustos etcd recover``'s annotation
    survivors: tuple[Survivor, ...] = ()  # members of this epoch that answer with their data
    backups: tuple[BackupCandidate, ...] = ()  # succeeded EtcdBackups of the namespace, any cluster's
    adoption: AdoptionSeen | None = None  # asked only while spec.adopt waits to start


ClusterStep = planner.Step | Blocked | StartRebuild | StartAdoption


def plan(o: ClusterObserved) -> ClusterStep:
    """The pass's one step: the start of a restore or an adoption instead of a seed, a rebuild
    (or why none starts) instead of a bare lost quorum, otherwise the membership planner's."""
    step = planner.plan(o.membership)
    spec = o.cluster.spec
    if isinstance(step, planner.CreateSeed):
        if spec.restore is not None:
            return restore_step(o)
        if spec.adopt is not None:
            return adoption_step(o.adoption, spec.version)
    if isinstance(step, planner.QuorumLost):
        return recovery_step(o, step)
    return step


def needs_adoption_check(cluster: EtcdCluster, membership: planner.Observed) -> bool:
    """Whether a pass must ask spec.adopt's endpoints: only while the adoption waits to start."""
    return (
        cluster.spec.adopt is not None
        and cluster.spec.restore is None
        and isinstance(planner.plan(membership), planner.CreateSeed)
    )


# ---- restore -------------------------------------------------------------------------------------


def restore_step(o: ClusterObserved) -> StartRebuild | Blocked:
    """A new cluster with spec.restore: its seed is rebuilt from the backup (of any cluster)."""
    assert o.cluster.spec.restore is not None
    name = o.cluster.spec.restore.backup
    source = recovery.choose_source([], list(o.backups), ("backup", name))
    if isinstance(source, str):
        return Blocked("RestoreWaiting", f"spec.restore: {source}", f"{source}; waiting for it")
    return StartRebuild(source, "spec.restore", _status(o.cluster).epoch)


# ---- adoption ------------------------------------------------------------------------------------


def adoption_step(seen: AdoptionSeen | None, wanted: str) -> StartAdoption | Blocked:
    verdict = adoption_refusal(seen, wanted) if seen is not None else "its endpoints were not asked yet"
    if verdict is not None:
        return Blocked("AdoptionWaiting", f"spec.adopt: {verdict}", verdict)
    assert seen is not None
    return StartAdoption(seen.cluster_id, seen.members, adopted_version(seen.answers))


def adopted_version(answers: Sequence[EndpointAnswer]) -> str:
    """The oldest version its members run: the one the cluster agrees on."""
    return min((a.version for a in answers), key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))


def adoption_refusal(seen: AdoptionSeen, wanted: str) -> str | None:
    """Why the cluster behind spec.adopt cannot be adopted as it is, or None."""
    if seen.unreachable is not None:
        return seen.unreachable
    answers = seen.answers
    if not answers:
        return "no endpoint answered"
    if len({a.cluster_id for a in answers}) != 1:
        return "the endpoints belong to different etcd clusters"
    troubled = [a for a in answers if a.errors or not a.has_leader]
    if troubled:
        return "the cluster has no leader or reports errors: " + "; ".join(
            f"{a.url}: {', '.join(a.errors) or 'no leader'}" for a in troubled
        )
    versions = {a.version for a in answers}
    version = adopted_version(answers)
    refusal = upgrade_refusal(version, wanted)
    path = version_path(version, wanted)
    if refusal is None and path and rollback_target(version, path[0]) is not None:
        # Adoption replaces members by new pods, and a new member of the older minor cannot join.
        refusal = f"adopt it on etcd {version} first, then roll back to {wanted}"
    if refusal is not None:
        return f"its members run etcd {', '.join(sorted(versions))}: {refusal}"
    if any(not m.name or not m.client_urls for m in seen.members):
        return "a member of it has not started (no name or client URL yet)"
    return None


# ---- recovery from a lost quorum ------------------------------------------------------------------


def recovery_source(o: ClusterObserved) -> Source | str:
    """What a rebuild would read: what was asked for, else the best survivor or own backup."""
    kind, name = recovery.parse_request(o.request) or (None, None)
    own = o.cluster.metadata["name"]
    backups = [b for b in o.backups if kind == "backup" or b.cluster == own]
    return recovery.choose_source(list(o.survivors), backups, (kind, name))


def recovery_step(o: ClusterObserved, lost: planner.QuorumLost) -> StartRebuild | planner.QuorumLost:
    """Start a rebuild if a person asked for one or it is automatic and due; otherwise say in
    the QuorumLost message what a rebuild would use and how to ask for it."""
    cluster, status = o.cluster, _status(o.cluster)
    last = status.recovery
    gave_up = last is not None and last.phase == "Failed" and last.epoch > status.epoch
    available = next((c for c in status.conditions if c.type == "Available"), None)
    lost_since = (
        parse_rfc3339(available.last_transition_time)
        if status.phase == "QuorumLost" and available is not None and available.status == "False"
        else None
    )
    reason = recovery.should_start(
        cluster.spec.recovery.automatic and not gave_up, parse_duration(cluster.spec.recovery.delay),
        lost_since, o.now, o.request is not None,
    )  # fmt: skip
    source = recovery_source(o)
    if reason is not None and not isinstance(source, str):
        epoch = max(status.epoch, last.epoch if last else 0) + 1
        return StartRebuild(source, reason, epoch)
    name, namespace = cluster.metadata["name"], cluster.metadata["namespace"]
    if isinstance(source, str):
        hint = f"cannot rebuild: {source}"
    elif gave_up:
        hint = f"the last rebuild failed; `kustos etcd recover {name} -n {namespace}` tries again"
    elif cluster.spec.recovery.automatic:
        hint = f"rebuilding from {source.describe()} after {cluster.spec.recovery.delay}"
    else:
        hint = f"`kustos etcd recover {name} -n {namespace}` rebuilds it from {source.describe()}"
    return planner.QuorumLost(
        f"{lost.message}; {hint}", refused=str(source) if o.request else None, seconds=lost.seconds
    )


def _status(cluster: EtcdCluster) -> EtcdClusterStatus:
    return cluster.status or EtcdClusterStatus()


__all__ = [
    "AdoptionSeen", "Blocked", "ClusterObserved", "ClusterStep", "EndpointAnswer", "ExternalMember",
    "StartAdoption", "StartRebuild", "adoption_refusal", "adoption_step", "needs_adoption_check", "plan",
    "recovery_source", "recovery_step", "restore_step",
]  # fmt: skip
