"""The facts a person on call needs about each object, computed purely from its status.

One home for them: the Prometheus collector exports them and ``kubectl kustos status`` prints
them, so a dashboard and the plugin never disagree. Time is an input (``now``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kustos.api.backup import BackupSchedule, EtcdBackup
from kustos.api.etcd import EtcdCluster
from kustos.api.maintenance import MaintenancePolicy
from kustos.runtime import objects
from kustos.runtime.observations import EtcdObservation
from kustos.runtime.times import cron_ticks, parse_duration, parse_rfc3339

Obj = Mapping[str, Any]

# NodeImage's Degraded reasons, folded into a bounded set so that a label never explodes:
# each provider error reason (ProviderCapacity, ProviderThrottled, ...) counts as Provider.
BLOCKED_REASONS = (
    "Paused",
    "InvalidSpec",
    "MalformedAnnotation",
    "EtcdUnset",
    "DrainBlocked",
    "Provider",
    "Other",
)


@dataclass(frozen=True)
class MemberFacts:
    name: str
    index: int | None
    """The member's index, from its pod name <cluster>-<index>."""
    healthy: bool
    learner: bool
    leader: bool
    unhealthy_seconds: float
    """How long it has been unhealthy (0 while healthy)."""
    backend_bytes: int | None
    """Its database file's size, from the controller's last observation (None: not observed)."""
    backend_in_use_bytes: int | None
    """The part of the file holding data (the rest a defragmentation gives back)."""
    backend_quota_bytes: int | None
    """Its backend quota, from the same observation."""


@dataclass(frozen=True)
class EtcdClusterFacts:
    namespace: str
    name: str
    desired_size: int
    phase: str | None
    version: str | None
    desired_version: str
    members: tuple[MemberFacts, ...]
    member_failure_timeout_seconds: float
    rebuilds: int
    """Disaster recoveries so far (status.epoch)."""
    restored: bool
    """Created from a backup (spec.restore), and the restore is done: the cluster formed."""
    recovering: bool
    leader_changes: int | None
    """Leader changes the controller saw (None: this operator has not observed the cluster)."""
    alarms: tuple[tuple[str, str], ...]
    """(member, alarm) pairs, like (a-0, NOSPACE), from the controller's last observation."""
    backup_interval_seconds: float | None
    """The scheduled backups' period; None without a schedule."""
    last_backup_time: datetime | None
    last_backup_size: int | None
    degraded: str | None
    """The Degraded condition's reason while it is True."""
    created: datetime | None = None
    """metadata.creationTimestamp: a schedule's first backup is due counting from it."""

    @property
    def backup_overdue_since(self) -> datetime | None:
        """The last good backup, or the creation before the first: the schedule is late
        when this is older than twice its period."""
        return self.last_backup_time or self.created

    @property
    def voters(self) -> int:
        return sum(1 for m in self.members if not m.learner)

    @property
    def healthy_voters(self) -> int:
        return sum(1 for m in self.members if m.healthy and not m.learner)

    @property
    def learners(self) -> int:
        return sum(1 for m in self.members if m.learner)

    @property
    def quorum(self) -> int:
        return self.voters // 2 + 1

    @property
    def quorum_margin(self) -> int:
        """Healthy voters beyond quorum: 0 means one more failure loses quorum, below 0 it is lost."""
        return self.healthy_voters - self.quorum

    @property
    def leader(self) -> MemberFacts | None:
        return next((m for m in self.members if m.leader), None)


@dataclass(frozen=True)
class NodeImageFacts:
    name: str
    up_to_date: int
    outdated: int
    replacing: int
    pending: int
    invalid: int
    paused: bool
    blocked: str | None
    """One of BLOCKED_REASONS while the rollout cannot move by itself, else None."""

    @property
    def total(self) -> int:
        return self.up_to_date + self.outdated + self.replacing


@dataclass(frozen=True)
class MaintenanceFacts:
    name: str
    dead_nodes: int
    last_action: tuple[str, str, datetime] | None
    """(action, outcome, time) of the newest action."""
    refusal: tuple[str, datetime] | None
    """(action, time) of the refusal still outstanding."""
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    """(action, outcome) -> actions recorded since this operator started (Clear/Done, .../Refused)."""
    purged: int = 0
    """Nodes whose purge finished (their Node deleted) since this operator started."""


@dataclass(frozen=True)
class StorageClusterFacts:
    namespace: str
    name: str
    phase: str | None
    nodes: int
    ready_nodes: int


# ---- EtcdCluster ---------------------------------------------------------------------------------


def member_index(cluster: str, member: str) -> int | None:
    """The index in a member pod's name <cluster>-<index> (the etcd planner's naming)."""
    prefix = f"{cluster}-"
    suffix = member[len(prefix) :] if member.startswith(prefix) else ""
    return int(suffix) if suffix.isdigit() else None


def schedule_period(schedule: BackupSchedule, now: datetime) -> float | None:
    """Seconds between two scheduled backups (the next two cron ticks after ``now``)."""
    if schedule.interval:
        return parse_duration(schedule.interval).total_seconds()
    if not schedule.schedule:
        return None
    try:
        ticks = cron_ticks(schedule.schedule, now)
        first, second = next(ticks), next(ticks)
    except ValueError:
        return None  # the backup controller reports a bad schedule in the cluster's conditions
    return (second - first).total_seconds()


def _true_condition(conditions: Iterable[Any], type_: str) -> str | None:
    for c in conditions:
        if c.type == type_ and c.status == "True":
            return str(c.reason)
    return None


def _false_condition(conditions: Iterable[Any], type_: str) -> bool:
    return any(c.type == type_ and c.status == "False" for c in conditions)


LastBackups = Mapping[tuple[str, str], tuple[datetime, int | None]]
"""(namespace, cluster) -> completion time and size of its newest Succeeded EtcdBackup."""


def last_backups(backups: Iterable[Obj]) -> LastBackups:
    """The newest Succeeded backup of each cluster, in one pass (not one per cluster)."""
    newest: dict[tuple[str, str], tuple[datetime, int | None]] = {}
    for backup in backups:
        try:
            b = EtcdBackup.model_validate(backup)
        except ValidationError:
            continue  # a backup that does not parse is no proof of a good one
        if b.status is None or b.status.phase != "Succeeded":
            continue
        done = parse_rfc3339(b.status.completion_time)
        key = (objects.namespace(backup) or "", b.spec.cluster_name)
        if done is not None and (key not in newest or done > newest[key][0]):
            newest[key] = (done, b.status.size)
    return newest


def etcd_cluster_facts(
    obj: Obj, backups: LastBackups, now: datetime, observed: EtcdObservation | None = None
) -> EtcdClusterFacts:
    """The facts of one EtcdCluster (a cache dict), with the newest backups (``last_backups``)
    and what its controller last saw through etcd (``observed``: backends, alarms, leader
    changes; absent in a process that does not run the controller)."""
    cluster = EtcdCluster.model_validate(obj)
    status = cluster.status
    name, namespace = objects.name(obj), objects.namespace(obj) or ""
    backends = {b.name: b for b in observed.members} if observed else {}
    members = []
    for m in status.members if status else []:
        since = parse_rfc3339(m.unhealthy_since)
        backend = backends.get(m.name)
        members.append(
            MemberFacts(
                name=m.name,
                index=member_index(name, m.name),
                healthy=m.healthy,
                learner=m.learner,
                leader=m.leader,
                unhealthy_seconds=0.0
                if m.healthy or since is None
                else max(0.0, (now - since).total_seconds()),
                backend_bytes=backend.db_size if backend else None,
                backend_in_use_bytes=backend.db_size_in_use if backend else None,
                backend_quota_bytes=backend.quota if backend else None,
            )
        )
    alarms = observed.alarms if observed else ()
    if not alarms and status and _false_condition(status.conditions, "SpaceAvailable"):
        # The EtcdCluster controller says NOSPACE on the cluster, not per member: member "".
        alarms = (("", "NOSPACE"),)
    last_time, last_size = backups.get((namespace, name), (None, None))
    spec = cluster.spec
    return EtcdClusterFacts(
        namespace=namespace,
        name=name,
        desired_size=spec.size,
        phase=status.phase if status else None,
        version=status.current_version if status else None,
        desired_version=spec.version,
        members=tuple(members),
        member_failure_timeout_seconds=parse_duration(spec.member_failure_timeout).total_seconds(),
        rebuilds=status.epoch if status else 0,
        restored=bool(
            spec.restore
            and status
            and status.cluster_id
            and not (status.recovery and status.recovery.phase == "Running")
        ),
        recovering=bool(status and status.recovery and status.recovery.phase == "Running"),
        leader_changes=observed.leader_changes if observed else None,
        alarms=alarms,
        backup_interval_seconds=schedule_period(spec.backup, now) if spec.backup else None,
        last_backup_time=last_time,
        last_backup_size=last_size,
        degraded=_true_condition(status.conditions, "Degraded") if status else None,
        created=parse_rfc3339((obj.get("metadata") or {}).get("creationTimestamp")),
    )


# ---- the other kinds -----------------------------------------------------------------------------


def blocked_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    if reason.startswith("Provider"):
        return "Provider"
    return reason if reason in BLOCKED_REASONS else "Other"


def node_image_facts(obj: Obj) -> NodeImageFacts:
    # Imported where used, as in storage_cluster_facts: a kind's models are built once its first
    # object loads its family, not by every operator (issue 28, idle RSS).
    from kustos.api.nodeimage import NodeImage

    image = NodeImage.model_validate(obj)
    s = image.status
    degraded = _true_condition(s.conditions, "Degraded") if s else None
    paused = image.spec.paused
    return NodeImageFacts(
        name=objects.name(obj),
        up_to_date=len(s.up_to_date) if s else 0,
        outdated=len(s.outdated) if s else 0,
        replacing=len(s.donors) if s else 0,
        pending=len(s.pending) if s else 0,
        invalid=len(s.invalid) if s else 0,
        paused=paused,
        blocked=blocked_reason(degraded) or ("Paused" if paused else None),
    )


def maintenance_facts(obj: Obj, counts: tuple[dict[tuple[str, str], int], int] = ({}, 0)) -> MaintenanceFacts:
    """A policy's facts, with what its controller counted (``Observations.maintenance``)."""
    policy = MaintenancePolicy.model_validate(obj)
    s = policy.status
    last = s.last_action if s else None
    refusal = s.last_refusal if s else None
    last_time = parse_rfc3339(last.time) if last else None
    refusal_time = parse_rfc3339(refusal.time) if refusal else None
    return MaintenanceFacts(
        name=objects.name(obj),
        dead_nodes=len(s.dead_nodes) if s else 0,
        last_action=(last.action, last.outcome, last_time) if last and last_time else None,
        refusal=(refusal.action, refusal_time) if refusal and refusal_time else None,
        counts=counts[0],
        purged=counts[1],
    )


def storage_cluster_facts(obj: Obj) -> StorageClusterFacts:
    from kustos.api.storage import StorageCluster

    storage = StorageCluster.model_validate(obj)
    s = storage.status
    health = s.node_health_status if s else {}
    return StorageClusterFacts(
        namespace=objects.namespace(obj) or "",
        name=objects.name(obj),
        phase=s.phase if s else None,
        nodes=len(health) or (len(s.nodes) if s else 0),
        ready_nodes=sum(1 for h in health.values() if h.ready),
    )
